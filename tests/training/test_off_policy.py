"""One step off-policy rollouts (rollout.max_off_policy_steps, training/pipeline.py): the truncated
importance weight, the config's errors, the version guard, and real runs of the tiny model: trees
lag one version and never span two, a stale tree is rejected and counted, lag 0 equals the
synchronous run, and a run resumed mid-pipeline continues exactly."""

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from arpo.algos.losses import clipped_surrogate, truncated_is_weight
from arpo.errors import ArpoError

TIMING = ("seconds", "tokens_per_s", "time_", "tool_seconds")


# ---- the clamp ------------------------------------------------------------------------------------
def test_truncated_is_weight_hand_values():
    # π_old / π_behav = 0.5/0.25 = 2 -> capped at C = 1.5; 0.9/0.9 = 1; 0.2/0.4 = 0.5; off the mask: 1
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2, 0.3]]))
    behav = torch.log(torch.tensor([[0.25, 0.9, 0.4, 0.01]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w = truncated_is_weight(old, behav, mask, cap=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 1.0, 0.5, 1.0]]), atol=1e-6)
    assert not w.requires_grad
    # the default C = 2: a ratio of 3 is cut to 2, one of 1.8 kept
    w2 = truncated_is_weight(torch.log(torch.tensor([[0.6, 0.9]])), torch.log(torch.tensor([[0.2, 0.5]])),
                             torch.ones(1, 2))
    assert torch.allclose(w2, torch.tensor([[2.0, 1.8]]), atol=1e-6)


def test_weighting_the_advantage_weights_the_clipped_loss():
    """The docstring's identity: −min(ρ·wÂ, clip(ρ)·wÂ) = w·(−min(ρÂ, clip(ρ)Â)) for w > 0 (dual clip too)."""
    g = torch.Generator().manual_seed(0)
    ratio = torch.rand(3, 7, generator=g) * 4
    adv = torch.randn(3, 7, generator=g)
    w = torch.rand(3, 7, generator=g) * 2 + 0.01
    a, _ = clipped_surrogate(ratio, adv * w)
    b, _ = clipped_surrogate(ratio, adv)
    assert torch.allclose(a, w * b, atol=1e-6)


# ---- config -----------------------------------------------------------------------------------------
def _cfg(**over):
    from arpo.config import load_config
    from arpo.settings import TrainConfig

    return load_config(TrainConfig, None, [f"{k}={v}" for k, v in over.items()])


@pytest.mark.parametrize("over, key", [
    ({"rollout.max_off_policy_steps": 2}, "rollout.max_off_policy_steps"),
    ({"rollout.max_off_policy_steps": -1}, "rollout.max_off_policy_steps"),
    ({"rollout.max_off_policy_steps": 1, "rollout.off_policy_is_cap": 0.5}, "rollout.off_policy_is_cap"),
])
def test_config_errors_name_the_key(over, key):
    with pytest.raises(ArpoError, match=key.replace(".", r"\.")):
        _cfg(**over).validate()


@pytest.mark.parametrize("over, says", [
    ({"engine": "vllm", "rollout.entropy_estimator": "topk"}, "engine hf or vllm_server"),
    ({"old_logprobs": "rollout"}, "old_logprobs"),
    ({"algo.preset": "dapo"}, "dynamic"),
])
def test_what_the_pipeline_does_not_support_is_refused_by_key(over, says):
    from arpo.training.pipeline import check_off_policy

    cfg = _cfg(**{"rollout.max_off_policy_steps": 1, **over})
    with pytest.raises(ArpoError, match=r"rollout\.max_off_policy_steps.*" + says):
        check_off_policy(cfg, cfg.algo.resolve(), multi=False)
    # torchrun: supported (each rank runs the pipeline; test_torchrun_two_ranks_off_policy_...)
    plain = _cfg(**{"rollout.max_off_policy_steps": 1})
    check_off_policy(plain, plain.algo.resolve(), multi=True)
    cfg0 = _cfg(**over)  # 0: nothing refused here
    check_off_policy(cfg0, cfg0.algo.resolve(), multi=True)


# ---- the version guard ------------------------------------------------------------------------------
def test_versions_are_read_per_token_and_the_engine_refuses_a_push_mid_rollout(tiny_lm, tiny_tok):
    from arpo.engine.base import SamplingParams
    from arpo.engine.hf import HFEngine
    from arpo.training.pipeline import VersionedEngine, snapshot, tag_versions

    gen = snapshot(tiny_lm)
    eng = VersionedEngine(HFEngine(gen, tiny_tok), gen)
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(gen.parameters(), tiny_lm.parameters(), strict=True))
    eng.begin()
    sid = eng.add([1, 2, 3], SamplingParams(temperature=1.0, max_len=40, seed=1))
    eng.step()
    with pytest.raises(RuntimeError, match="span two policy versions"):
        eng.load_weights(tiny_lm)
    with pytest.raises(RuntimeError, match="span two policy versions"):
        eng.set_version(1)
    (kid,) = eng.fork(sid, 1, seeds=[2])
    trajs = [SimpleNamespace(traj=SimpleNamespace(sid=s)) for s in (sid, kid)]
    tree = SimpleNamespace(prompt_id="p", trajectories=trajs)
    tag_versions([tree], eng)
    assert tree.policy_version == 0
    eng.version = 1  # what the guard prevents: a new version in the middle of the tree
    eng.step()
    with pytest.raises(RuntimeError, match=r"spans policy versions \[0, 1\]"):
        tag_versions([tree], eng)
    eng.end()
    with torch.no_grad():
        tiny_lm.lm_head.weight.add_(1.0)
    assert eng.load_weights(tiny_lm) > 0  # idle: the snapshot takes the policy's weights
    assert torch.equal(gen.lm_head.weight, tiny_lm.lm_head.weight)
    with torch.no_grad():
        tiny_lm.lm_head.weight.sub_(1.0)


def test_every_rank_joins_its_batch_and_a_barrier_before_the_sync():
    """off_policy_groups: take (this rank's batch joined) → barrier (every rank's: the servers are shared)
    → sync → start the next batch; on the last step the sync still runs (the FSDP replica computes π_old)."""
    from arpo.training.trainer import off_policy_groups

    events = []
    tr = SimpleNamespace(cfg=SimpleNamespace(steps=3, rollout=SimpleNamespace(max_off_policy_steps=1)),
                         pipe=SimpleNamespace(take=lambda s: events.append("take") or [],
                                              start=lambda s, fn: events.append(f"start {s}")),
                         comm=SimpleNamespace(barrier=lambda: events.append("barrier"), per_rank=lambda x: [x],
                                              total=lambda x: x),
                         engine_ready=lambda: events.append("sync"))
    off_policy_groups(tr, 1)
    assert events == ["take", "barrier", "sync", "start 2"]
    events.clear()
    off_policy_groups(tr, 2)
    assert events == ["take", "barrier", "sync"]


def test_in_flight_trees_saved_per_rank_and_resliced_on_another_rank_count(tmp_path):
    """Each rank checkpoints its own in-flight trees; state.json lists every rank's prompts in global
    order. A resume on the saving rank count gives each rank its file; on another count the global list
    is re-sliced like the prompts. Ranks that disagree on the step all raise."""
    from arpo.rollout.tree import RolloutTree
    from arpo.training.pipeline import RolloutPipeline, in_flight_checkpoint, restore_in_flight
    from arpo.training.safe_state import save_state

    trees = [[RolloutTree(p, [1, 2], [], policy_version=1) for p in ps] for ps in (["a", "b"], ["c"])]
    parts = [(2, [(t.prompt_id, 1) for t in ts]) for ts in trees]  # what the gather returns on every rank
    for r in (0, 1):
        pipe = RolloutPipeline()
        pipe.restore(2, trees[r])
        extra, files = in_flight_checkpoint(pipe, r, 2, gather=lambda mine: parts)
        pipe.close()
        assert extra["in_flight"] == {"step": 2, "files": ["in_flight.rank0.json", "in_flight.rank1.json"],
                                      "prompt_ids": ["a", "b", "c"], "policy_versions": [1]}
        ((name, obj),) = files.items()
        assert name == f"in_flight.rank{r}.json"
        save_state(obj, tmp_path / name)

    def restored(rank, world):
        pipe = RolloutPipeline()
        restore_in_flight(pipe, tmp_path, extra, rank, world)
        got = pipe.take(2)
        pipe.close()
        return [t.prompt_id for t in got]

    assert [restored(r, 2) for r in (0, 1)] == [["a", "b"], ["c"]]
    assert restored(0, 1) == ["a", "b", "c"]
    assert [restored(r, 3) for r in range(3)] == [["a"], ["b"], ["c"]]
    pipe = RolloutPipeline()
    pipe.restore(2, trees[0])
    with pytest.raises(RuntimeError, match="disagree"):
        in_flight_checkpoint(pipe, 0, 2, gather=lambda mine: [mine, None])
    pipe.close()


# ---- real runs --------------------------------------------------------------------------------------
def _run(tiny_dir, run_dir, resume=False, **over):
    from arpo.recipes import train

    ov = {"model.name": tiny_dir / "model", "data.path": tiny_dir / "q.jsonl", "tools.enabled": "[]",
          "agent.max_response_tokens": 12, "rollout.group_size": 4, "rollout.initial_rollouts": 2,
          "reward.fn": "arpo.testing:toy_reward", "steps": 4, "prompts_per_step": 2, "optim.lr": 1e-2,
          "run.dir": run_dir, "run.save_every": 1, "run.keep_checkpoints": 10, "run.tensorboard": "false",
          "run.threads": 1, "run.seed": 3, "rollout.max_off_policy_steps": 1, **over}
    threads = torch.get_num_threads()
    try:
        return train.run(_cfg(**ov), resume=resume, quiet=True)
    finally:
        torch.set_num_threads(threads)


def _rows(run_dir):
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in rows]


def _weights(run_dir, step=None):
    ck = Path(run_dir) / "checkpoints"
    name = f"step_{step:06d}" if step is not None else (ck / "latest").read_text().strip()
    return load_file(str(ck / name / "model" / "model.safetensors"))


def test_trees_lag_one_version_generated_with_that_versions_weights(tiny_dir, tmp_path, monkeypatch):
    """Step n's trees come from the thread that ran while step n−1 trained, with version n−1's weights
    (exactly the checkpoint of step n−1), every generated token of a tree under that one version."""
    import arpo.training.trainer as trainer_mod
    from arpo.training.pipeline import tag_versions
    from arpo.training.rollout_log import read_run_trees

    seen = []  # (thread, engine version, per-tree version sets, the generating weights)

    def recording(trees, engine):
        sets = [engine.versions_of(t) for t in trees]
        weights = {k: v.clone() for k, v in engine.module.state_dict().items()}
        seen.append((threading.current_thread().name, engine.version, sets, weights))
        tag_versions(trees, engine)

    monkeypatch.setattr(trainer_mod, "tag_versions", recording)
    run = tmp_path / "run"
    _run(tiny_dir, run, **{"run.save_rollouts": 1, "run.rollout_trees": 0})
    rows = _rows(run)
    assert [r["policy_lag_max"] for r in rows] == [0, 1, 1, 1]
    assert [r["policy_lag_mean"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["stale_trees_rejected"] == 0 for r in rows) and all("is_weight_mean" in r for r in rows)
    # step 0's trees generated now (main thread, version 0); steps 1-3's in the thread, versions 0, 1, 2
    assert [v for _, v, _, _ in seen] == [0, 0, 1, 2]
    assert seen[0][0] == threading.main_thread().name and all(n.startswith("arpo-rollout") for n, *_ in seen[1:])
    for _, v, sets, _ in seen:
        assert sets and all(s == {v} for s in sets)
    for _, v, _, weights in seen:  # version v's weights: the model for v = 0, else the checkpoint of step v
        ref = load_file(str(tiny_dir / "model" / "model.safetensors")) if v == 0 else _weights(run, v)
        assert ref and all(torch.equal(weights[k], t) for k, t in ref.items())
    assert not all(torch.equal(_weights(run, 1)[k], t) for k, t in _weights(run, 2).items())  # versions differ
    recs = read_run_trees(run)
    assert recs and {r["step"] - 1 - r["policy_version"] for r in recs} == {0, 1}


def test_a_stale_tree_is_rejected_and_counted(tiny_dir, tmp_path, monkeypatch):
    """A tree older than max_off_policy_steps versions (here: made to look two versions old) is not trained."""
    import arpo.training.trainer as trainer_mod
    from arpo.training.pipeline import tag_versions

    def aging(trees, engine):
        tag_versions(trees, engine)
        if engine.version == 1:  # the trees of step 2: the first one claims version -1 (lag 3)
            trees[0].policy_version = -1

    monkeypatch.setattr(trainer_mod, "tag_versions", aging)
    run = tmp_path / "run"
    _run(tiny_dir, run, steps=3)
    rows = _rows(run)
    assert [r["stale_trees_rejected"] for r in rows] == [0, 0, 1]
    assert [r["trajectories"] for r in rows] == [8, 8, 4]  # 2 trees of 4; step 3 trains the one left
    assert rows[2]["policy_lag_max"] == 1


def test_lag_zero_equals_the_synchronous_run(tiny_dir, tmp_path):
    """One step (nothing in flight, lag 0): the snapshot generates the trees the policy generates in a
    synchronous run, and the update is the same (w = π_old/π_behav = 1 up to float rounding)."""
    over = {"steps": 1, "old_logprobs": "recompute", "run.save_rollouts": 1, "run.rollout_trees": 0}
    _run(tiny_dir, tmp_path / "sync", **over, **{"rollout.max_off_policy_steps": 0})
    _run(tiny_dir, tmp_path / "off", **over)
    from arpo.training.rollout_log import read_run_trees

    ta, tb = read_run_trees(tmp_path / "sync"), read_run_trees(tmp_path / "off")
    strip = ("advantage", "logp", "summary", "policy_version")

    def clean(recs):
        return [{k: (v if k != "trajectories" else [{a: b for a, b in t.items() if a not in strip} for t in v])
                 for k, v in r.items() if k not in strip} for r in recs]

    assert clean(ta) == clean(tb) and {r["policy_version"] for r in tb} == {0}
    (ra,), (rb,) = _rows(tmp_path / "sync"), _rows(tmp_path / "off")
    assert abs(rb.pop("is_weight_mean") - 1.0) < 1e-5 and rb.pop("is_weight_capped_frac") == 0.0
    assert {rb.pop(k) for k in ("policy_lag_mean", "policy_lag_max", "stale_trees_rejected",
                                "behaviour_nonfinite_tokens")} == {0}
    assert ra.keys() == rb.keys()
    for k in ra:
        assert ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-6), k
    wa, wb = _weights(tmp_path / "sync"), _weights(tmp_path / "off")
    # AdamW's first step moves each weight by about lr = 1e-2 whatever the gradient's size: a gradient
    # that differs by float rounding moves it by ~1e-5 (measured: max 3.7e-5 on 4 of 8192 weights)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-4) for k in wa)


def test_resume_mid_pipeline_continues_exactly(tiny_dir, tmp_path, monkeypatch):
    """Stopped after the checkpoint of step 2 (the trees of step 3 in flight), then resumed: the same
    metrics, trees and weights as the uninterrupted run."""
    import arpo.recipes.train as recipe

    full, cut = tmp_path / "full", tmp_path / "cut"
    _run(tiny_dir, full)
    real = recipe.train_step

    def crash(tr, step):
        if step == 2:
            raise _Killed("mid-pipeline")
        return real(tr, step)

    monkeypatch.setattr(recipe, "train_step", crash)
    with pytest.raises(_Killed):
        _run(tiny_dir, cut)
    monkeypatch.setattr(recipe, "train_step", real)
    state = json.loads((cut / "checkpoints" / "step_000002" / "state.json").read_text())
    assert state["in_flight"]["step"] == 2 and state["in_flight"]["policy_versions"] == [1]
    assert len(state["in_flight"]["prompt_ids"]) == 2
    assert (cut / "checkpoints" / "step_000002" / state["in_flight"]["files"][0]).is_file()
    assert "in_flight" not in json.loads((full / "checkpoints" / "step_000004" / "state.json").read_text())
    _run(tiny_dir, cut, resume=True)
    ra, rb = _rows(full), _rows(cut)
    assert [r["step"] for r in rb] == [1, 2, 3, 4]
    assert ra == rb
    wa, wb = _weights(full), _weights(cut)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


class _Killed(Exception):
    """The run stops here (as if killed after its last checkpoint)."""


def test_tool_calls_branches_and_validation_off_policy(scripted_run, tmp_path):
    """With the python tool, ARPO branches (forks share their parent's tokens) and validation between
    steps (which waits for the trees in flight, then syncs the engine): still one version per tree,
    lag 1 from the second step on."""
    from arpo.training.rollout_log import read_run_trees

    run = scripted_run(tmp_path, steps=3, **{"rollout.max_off_policy_steps": 1, "rollout.branch_threshold": 0.0,
                                             "run.save_rollouts": 1, "run.rollout_trees": 0,
                                             "validation.path": tmp_path / "q.jsonl", "validation.every": 1,
                                             "validation.limit": 2})
    rows = _rows(run)
    assert sum(r["branches"] for r in rows) > 0 and all(r["tool_calls_per_traj"] > 0 for r in rows)
    assert [r["policy_lag_max"] for r in rows] == [0, 1, 1] and all("val/pass@1" in r for r in rows)
    recs = read_run_trees(run)
    assert any(t["parent"] is not None for r in recs for t in r["trajectories"])  # forks were trained
    assert {r["step"] - 1 - r["policy_version"] for r in recs if r["step"] > 1} == {1}


# ---- torchrun: 2 ranks (gloo, FSDP2, fp32) ------------------------------------------------------------
def _torchrun_args(tiny_dir, run_dir):
    ov = {"model.name": tiny_dir / "model", "model.dtype": "float32", "data.path": tiny_dir / "q.jsonl",
          "tools.enabled": "[]", "agent.max_response_tokens": 12, "rollout.group_size": 4,
          "rollout.initial_rollouts": 2, "reward.fn": "arpo.testing:toy_reward", "steps": 3, "prompts_per_step": 2,
          "optim.lr": 1e-2, "run.dir": run_dir, "run.save_every": 1, "run.keep_checkpoints": 10,
          "run.tensorboard": "false", "run.threads": 1, "run.seed": 3, "rollout.max_off_policy_steps": 1}
    return [f"{k}={v}" for k, v in ov.items()]


def _torchrun(tiny_dir, run_dir, *flags):
    import os
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             "-m", "arpo", "train", *_torchrun_args(tiny_dir, run_dir), "--quiet", *flags],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(p, timeout=600):
    _, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-4000:]


def test_torchrun_two_ranks_off_policy_lag_one_deterministic_and_resumed_mid_pipeline(tiny_dir, tmp_path):
    """2 ranks, hf engine (each rank decodes with its FSDP generation replica, the snapshot): lag 0, 1, 1,
    nothing stale, the rollout thread joined before every sync (else the run deadlocks or a tree spans
    two versions, which tag_versions refuses). A second run, SIGKILLed once the checkpoint of step 2
    (each rank's in-flight trees of step 3 in its own file) is published and resumed on 2 ranks,
    ends with the same metrics and the same weights."""
    import os
    import signal
    import time

    from arpo.training.safe_state import load_state

    full, cut = tmp_path / "full", tmp_path / "cut"
    _finish(_torchrun(tiny_dir, full))
    rows = _rows(full)
    assert [r["policy_lag_max"] for r in rows] == [0, 1, 1]
    assert all(r["stale_trees_rejected"] == 0 and r["trajectories"] == 8 for r in rows)
    # π_old (version n, the rank's replica synced at every step, the last one too) vs π_behav (version n−1)
    assert all(r["is_weight_mean"] != 1.0 for r in rows[1:])
    p = _torchrun(tiny_dir, cut)
    deadline = time.time() + 600
    while time.time() < deadline and p.poll() is None:
        if (cut / "checkpoints" / "step_000002" / "state.json").exists():
            kids = Path(f"/proc/{p.pid}/task/{p.pid}/children")
            for pid in kids.read_text().split() if kids.exists() else []:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    p.communicate()
    assert p.returncode == -signal.SIGKILL and not (cut / "checkpoints" / "step_000003").exists()
    ck = cut / "checkpoints" / "step_000002"
    info = json.loads((ck / "state.json").read_text())["in_flight"]
    assert info["step"] == 2 and info["policy_versions"] == [1] and len(info["prompt_ids"]) == 2
    assert info["files"] == ["in_flight.rank0.json", "in_flight.rank1.json"]
    assert [len(load_state(ck / f)) for f in info["files"]] == [1, 1]  # each rank's tree (JSON + safetensors)
    _finish(_torchrun(tiny_dir, cut, "--resume"))
    assert _rows(cut) == rows
    wa, wb = _weights(full), _weights(cut)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
