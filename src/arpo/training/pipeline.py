"""One step off-policy rollouts (`rollout.max_off_policy_steps: 1`): the trees of step n+1 are
generated in a background thread, with the weights of version n, while step n trains.

    step n:  take(n)      the trees of step n, generated under version n−1 (step 0, or a run resumed
                          without them: generated now, under version n)
             sync         the engine gets version n: the only moment weights reach it, with no tree
                          in flight (VersionedEngine refuses a push during a rollout)
             start(n+1)   thread: roll out and score the trees of step n+1 on the engine (version n)
             train n      on the taken trees: old log-probs recomputed under version n, each token's
                          loss weighted by min(π_old/π_behav, C) (algos/losses.truncated_is_weight);
                          a tree older than max_off_policy_steps is rejected (stale_trees_rejected)

A version is the number of steps trained: step n trains version n into n+1. Every tree records the
version of all its tokens (`RolloutTree.policy_version`), read off the engine per generated token, so
ARPO's ΔH (a trajectory's entropy against its own initial entropy) never compares two versions.

Engines: `vllm_server` holds version n on its servers until the next sync. `hf` would decode with the
policy module the trainer is updating, so it decodes with a snapshot instead: one more copy of the
weights in the model dtype (no gradients, no optimizer state), refreshed in place at each sync; its KV
cache now lives during training too. The in-process `vllm` engine is refused (`check_off_policy`).

Under torchrun (W ranks) every rank runs this pipeline on its slice of the prompts. hf: the rank's FSDP
generation replica (training/distributed.py) is the snapshot (no third copy; DDP: a snapshot as in one
process), refreshed by `ParallelModel.sync_rollout` at the sync only. vllm_server: the ranks roll out on
the shared servers, so the sync (rank 0 pushes) must wait for every rank's batch: each rank joins its own
batch, then a barrier (`off_policy_groups`), then the push. Every collective (the sync's gathers, metrics,
the barrier) runs on the main thread; the rollout thread only generates and scores. A checkpoint keeps
each rank's in-flight trees in its own file (`in_flight_checkpoint`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from arpo.engine.base import SamplingParams, Sequence, StepOutput
from arpo.errors import ArpoError
from arpo.training.checkpoint import read_pickle
from arpo.training.safe_state import load_state


def check_off_policy(cfg, preset, multi: bool) -> None:
    """Refuse what the pipeline does not support, naming the key."""
    if not cfg.rollout.max_off_policy_steps:
        return
    key = "rollout.max_off_policy_steps"
    if cfg.engine not in ("hf", "vllm_server"):
        raise ArpoError(f"{key}: one step off-policy runs with engine hf or vllm_server, not {cfg.engine!r} "
                        "(the in-process vLLM engine would generate on the GPU the trainer uses): set engine, or 0")
    if preset.dynamic_sampling:
        raise ArpoError(f"{key}: the preset {preset.name!r} samples dynamically (rounds that depend on the rewards "
                        "of the step): set it to 0, or pick a preset without dynamic sampling")
    if cfg.old_logprobs == "rollout":
        raise ArpoError(f"{key}: old_logprobs rollout would take the generating version's log-probs as π_old; "
                        "off-policy recomputes them under the current weights: set old_logprobs auto or recompute")
    # the importance weight min(π_old/π_behaviour, C) needs π_behaviour = the distribution the engine sampled
    # from; top-p / top-k sample from a truncated, renormalized one, whose log-probs the engines do not record
    # (and π_old, a full softmax, gives every truncated token mass): the weights would be biased
    if cfg.agent.top_p < 1.0:
        raise ArpoError(f"agent.top_p: must be 1 with {key} >= 1, got {cfg.agent.top_p}: nucleus sampling "
                        "biases the importance weights π_old/π_behaviour (set agent.top_p=1, or the key to 0)")
    if cfg.agent.top_k > 0:
        raise ArpoError(f"agent.top_k: must be 0 with {key} >= 1, got {cfg.agent.top_k}: top-k sampling "
                        "biases the importance weights π_old/π_behaviour (set agent.top_k=0, or the key to 0)")


def snapshot(model) -> torch.nn.Module:
    """A generation copy of the policy: same weights, no gradients, eval mode."""
    return copy.deepcopy(model).requires_grad_(False).eval()


def copy_weights(dst, src) -> int:
    """dst's parameters and buffers := src's (same module structure), in place. Returns tensors copied
    (0 when dst is src: under FSDP the hf engine decodes with the replica that sync_rollout refreshes)."""
    if dst is src:
        return 0
    s = dict(src.named_parameters())
    s.update(src.named_buffers())
    n = 0
    with torch.no_grad():
        for name, t in [*dst.named_parameters(), *dst.named_buffers()]:
            t.copy_(s[name])  # in place: the hf engine's packed weights see the version counter move
            n += 1
    return n


class VersionedEngine:
    """An engine (engine/base.py) that knows the policy version of its weights and records, per
    sequence, the versions its tokens were sampled under. `load_weights`/`set_version` refuse while a
    rollout is in flight (between `begin` and `end`): a tree can never span an update. With `module`
    (hf: the snapshot it decodes with) `load_weights` copies the policy into that module."""

    def __init__(self, engine, module=None):
        self.inner, self.module = engine, module
        self.tokenizer = engine.tokenizer
        self.stats: dict = engine.stats  # the engine's own dict (it counts in place)
        self.version = 0
        self.busy = False
        self.token_versions: dict[int, set[int]] = {}  # sid -> versions of its generated tokens

    # ---- the pipeline's guard -------------------------------------------------------------------
    def begin(self) -> None:
        self.busy, self.token_versions = True, {}

    def end(self) -> None:
        self.busy = False

    def check_idle(self, what: str) -> None:
        self._idle(what)

    def _idle(self, what: str) -> None:
        if self.busy:
            raise RuntimeError(f"{what} while a rollout is in flight: a tree would span two policy versions")

    def set_version(self, version: int) -> None:
        if version != self.version:
            self._idle("policy version changed")
        self.version = version

    def versions_of(self, tree) -> set[int]:
        """The versions under which the tokens of a tree's trajectories were generated."""
        return set().union(*(self.token_versions.get(t.traj.sid, set()) for t in tree.trajectories))

    # ---- the Engine protocol ----------------------------------------------------------------------
    def add(self, prompt_ids: list[int], params: SamplingParams) -> int:
        sid = self.inner.add(prompt_ids, params)
        self.token_versions[sid] = set()
        return sid

    def step(self) -> list[StepOutput]:
        outs = self.inner.step()
        for o in outs:
            self.token_versions.setdefault(o.sid, set()).add(self.version)
        return outs

    def append(self, sid: int, token_ids: list[int]) -> None:
        self.inner.append(sid, token_ids)

    def fork(self, sid: int, n: int, at: int | None = None, seeds: list[int] | None = None) -> list[int]:
        kids = self.inner.fork(sid, n, at=at, seeds=seeds)
        for k in kids:  # a fork's shared tokens are its parent's
            self.token_versions[k] = set(self.token_versions.get(sid, set()))
        return kids

    def release(self, sid: int) -> None:
        self.inner.release(sid)

    def finish(self, sid: int, reason: str = "stop") -> None:
        self.inner.finish(sid, reason)

    def seq(self, sid: int) -> Sequence:
        return self.inner.seq(sid)

    def has_unfinished(self) -> bool:
        return self.inner.has_unfinished()

    def load_weights(self, model) -> int:
        self._idle("weights pushed")
        return copy_weights(self.module, model) if self.module is not None else self.inner.load_weights(model)

    def sleep(self, level: int = 1) -> bool:
        return self.inner.sleep(level)

    def wake_up(self) -> bool:
        return self.inner.wake_up()

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str):  # engine-specific extras (context_len, ...)
        inner = self.__dict__.get("inner")
        if inner is None:  # during copy / unpickling
            raise AttributeError(name)
        return getattr(inner, name)


def tag_versions(trees: list, engine: VersionedEngine) -> None:
    """Set each tree's policy_version from the versions its tokens were generated under."""
    for t in trees:
        vs = engine.versions_of(t)
        if len(vs) > 1:
            raise RuntimeError(f"tree of prompt {t.prompt_id} spans policy versions {sorted(vs)}")
        t.policy_version = vs.pop() if vs else engine.version


def lag_metrics(lags: list[int], rejected: int) -> dict:
    """policy_lag_mean / _max over the trees a step trains on, and the trees it rejected as stale."""
    return {"policy_lag_mean": sum(lags) / len(lags) if lags else 0.0, "policy_lag_max": max(lags, default=0),
            "stale_trees_rejected": rejected}


class RolloutPipeline:
    """At most one batch of trees in flight: `start(step, fn)` runs fn() (the trees of `step`) in a
    background thread; `take(step)` returns them (waiting if needed), or None if none are for `step`."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arpo-rollout")
        self._future: Future | None = None
        self._step: int | None = None
        self._done: tuple[int, list] | None = None  # (step, trees) generated and waiting to be trained

    def start(self, step: int, fn: Callable[[], list]) -> None:
        if self._future is not None or self._done is not None:
            raise RuntimeError("a batch of trees is already in flight")
        self._step, self._future = step, self._pool.submit(fn)

    def wait(self) -> tuple[int, list] | None:
        """Join the batch in flight (a generation error is raised here); returns (step, trees) or None."""
        if self._future is not None:
            fut, self._future = self._future, None
            assert self._step is not None
            self._done = (self._step, fut.result())
        return self._done

    def take(self, step: int) -> list | None:
        done, self._done = self.wait(), None
        return done[1] if done is not None and done[0] == step else None

    def restore(self, step: int, trees: list) -> None:
        """Trees of `step` generated before a resume (the checkpoint's in-flight batch)."""
        self._done = (step, trees)

    def close(self) -> None:
        fut, self._future = self._future, None
        if fut is not None:
            fut.exception()  # wait for it; an error no longer matters
        self._pool.shutdown(wait=True)


IN_FLIGHT = "in_flight.json"  # a checkpoint's batch of trees generated for the next step (safe_state: + .safetensors)


def in_flight_file(rank: int, world: int) -> str:
    """The file of rank `rank`'s in-flight trees (one process: in_flight.json)."""
    return IN_FLIGHT if world == 1 else f"in_flight.rank{rank}.json"


def in_flight_checkpoint(pipe: RolloutPipeline, rank: int = 0, world: int = 1, gather=None) -> tuple[dict, dict]:
    """What a checkpoint keeps of the pipeline: (state.json entries, {file name: object} of this rank). The
    batch in flight is finished first; its trees are saved whole, since the weights that generated them
    are gone after the update. Under torchrun each rank saves its own trees (in_flight_file) and
    `gather` (a collective, main thread) collects every rank's prompt ids and versions for state.json.
    The prompts consumed are those of the steps before the checkpoint's (the data order is a pure
    function of the step, data/order.py); the in-flight ones are listed, in global order."""
    done = pipe.wait()
    mine = None if done is None else (done[0], [(t.prompt_id, t.policy_version) for t in done[1]])
    parts = gather(mine) if gather is not None else [mine]
    steps = [None if p is None else p[0] for p in parts]
    if len(set(steps)) > 1:  # every rank raises: none waits in the next collective
        raise RuntimeError(f"ranks disagree on the in-flight step: {steps}")
    if done is None:
        return {}, {}
    step, trees = done
    pairs = [x for p in parts if p is not None for x in p[1]]
    files = [in_flight_file(r, world) for r in range(world)]
    return ({"in_flight": {"step": step, "files": files, "prompt_ids": [pid for pid, _ in pairs],
                           "policy_versions": sorted({v for _, v in pairs})}},
            {files[rank]: trees})


def restore_in_flight(pipe: RolloutPipeline, ckpt, state: dict, rank: int = 0, world: int = 1,
                      allow_pickle: bool = False) -> None:
    """On --resume: the checkpoint's in-flight trees become the next step's, as in the run that saved it.
    On the rank count that saved them each rank takes its own file; on another count the ranks' trees,
    concatenated in rank order (the step's global order), are re-sliced like the prompts
    (distributed.shard). An older checkpoint's pickled trees (in_flight*.pt) only with `allow_pickle`."""
    info = state.get("in_flight")
    if not info:
        return
    files = info.get("files") or [info["file"]]

    def load(name: str) -> list:
        path = Path(ckpt) / name
        if not name.endswith(".pt"):
            return load_state(path)
        try:
            return read_pickle(path, allow_pickle, "the in-flight rollout trees")
        except (OSError, EOFError, RuntimeError) as e:
            raise ArpoError(f"{path}: cannot read the checkpoint's in-flight rollout trees ({e})") from e

    if len(files) == world:
        trees = load(files[rank])
    else:
        every = [t for name in files for t in load(name)]
        trees = every[len(every) * rank // world: len(every) * (rank + 1) // world]
    pipe.restore(int(info["step"]), trees)
