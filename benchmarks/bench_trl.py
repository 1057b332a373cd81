"""One full RL step: arpo vs TRL's GRPOTrainer (benchmarks issue, item 4).

Same model (the default SmolLM2-135M-Instruct, float32, CPU), same prompts (GSM8K train rows rendered
with arpo's math prompt; both sides get identical prompt token ids, checked), group size G, max
completion length, temperature 1.0 (top-p 1, top-k off), no KL / no reference model, one AdamW
optimizer step with the same lr, betas, weight decay (not on biases / norms) and grad clip 1.0.

* arpo: one step as `arpo train` runs it (recipes/train.py, GRPO preset: every trajectory a global
  sample): rollout_step -> score_trees -> rollout_metrics -> build_batch (advantages) -> token_logprobs
  (old log-probs) -> loss_and_backward -> clip_gradients -> AdamW step.
* TRL: `GRPOTrainer.train()` on an in-memory dataset of the same prompts, num_generations=G, one
  optimizer step = all prompts x G completions generated in one batch, forward/backward in
  micro-batches of `--trl-micro-batch` rows (gradient accumulation; arpo's default micro-batch is
  4096 tokens, i.e. the whole packed batch here; TRL with all 16 rows at once ran out of memory on
  this shared 23 GB machine), use_cpu, bf16 off,
  gradient checkpointing off (GRPOConfig turns it on by default; off is TRL's faster setting for a
  model this small; `--trl-gradient-checkpointing` turns it back on), the same arpo reward on the
  decoded completion tokens. A TRL step is timed by callbacks from on_step_begin to on_step_end
  (generation, rewards, advantages, forward + loss, backward, grad clip, optimizer step).

No tools: TRL's tool mode (`tools=`) needs JSON function calls rendered and parsed by a chat template
that supports tool calling; SmolLM2's template ignores `tools=` (TRL refuses it), and TRL has no way to
pause generation at arpo's `<python>...</python>` tags, so the same tool rollout cannot be expressed.

Side by side in one process: TRL's training loop runs warm-up + repeats steps, and after each TRL step
(from its on_step_end callback) one arpo step runs; the first pair is a warm-up and is excluded;
medians are reported. Peak RSS is sampled (/proc/self/statm, 20 ms) during each step: both models live
in the process, so the step's *increase* over the RSS at its start (after malloc_trim) is reported —
approximate, since memory freed but kept by the allocator can be reused unseen; the warm-up step's
increase (which also allocates the AdamW state and the gradients, ~1.6 GB) is reported apart.

    python benchmarks/bench_trl.py [--json] [--quick] [--prompts 4] [--g 4] [--max-len 64] [--threads 1]
Goal: arpo step time / TRL step time <= 0.5.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

SKIP_REASON = "trl is not installed (benchmark-only dependency: pip install 'arpo[bench]')"


def _trim() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class RssPeak:
    """Max resident set size of this process while the block runs, sampled every `interval` s."""

    def __init__(self, interval: float = 0.02):
        self.interval, self.page = interval, os.sysconf("SC_PAGE_SIZE")

    def rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def __enter__(self):
        _trim()  # hand memory freed by the previous step back to the OS, so the increase is this step's
        self.start = self.peak = self.rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.rss())
        return False

    @property
    def increase_gb(self) -> float:
        return (self.peak - self.start) / 2**30


# ------------------------------------------------------------------------------------------------
# arpo: one step of recipes/train.py's loop (GRPO preset, one mini-batch, one PPO epoch)
# ------------------------------------------------------------------------------------------------


class ArpoStep:
    """`arpo train algo.preset=grpo` on these prompts: training/trainer.py's own setup + train_step."""

    def __init__(self, model, tok, examples, prompts, a, total_steps: int):
        from arpo.rewards import get_reward_fn
        from arpo.settings import AgentConfig, AlgoConfig, OptimConfig, RolloutConfig, ToolsConfig, TrainConfig
        from arpo.training import trainer

        cfg = TrainConfig(
            tools=ToolsConfig(enabled=[]),  # no tools (see the module docstring)
            agent=AgentConfig(max_response_tokens=a.max_len, temperature=a.temperature, top_p=1.0, top_k=0),
            rollout=RolloutConfig(group_size=a.g, initial_rollouts=a.g), algo=AlgoConfig(preset="grpo"),
            optim=OptimConfig(lr=a.lr), steps=total_steps, prompts_per_step=len(examples),
            old_logprobs="recompute" if getattr(a, "recompute_old_logprobs", False) else "auto",
        )
        cfg.run.seed = a.seed
        cfg.validate()
        self.errors: list = []
        self.trainer = trainer
        self.tr = trainer.setup(cfg, cfg.algo.resolve(), examples, get_reward_fn("arpo"),
                                log_error=self.errors.append, model_and_tok=(model, tok))

    def step(self, step: int) -> dict:
        m, trees = self.trainer.train_step(self.tr, step)
        if self.errors or "skipped" in m:
            raise RuntimeError("arpo rollout failed: " + "\n".join(self.errors))
        t = {"generation": m["time_generation"], "rewards": m["time_rewards"], "advantages_batch": m["time_batch"],
             "old_logprobs": m["time_old_logprobs"], "forward_loss_backward": m["time_backward"],
             "optimizer": m["time_optimizer"]}
        return {"seconds": m["step_seconds"], "split": t, "generated_tokens": sum(
            x.traj.n_generated_tokens for tr in trees for x in tr.trajectories),
                "trained_tokens": m["trained_tokens"], "reward_mean": m["reward_mean"], "loss": m["loss"]}


# ------------------------------------------------------------------------------------------------
# TRL: GRPOTrainer with timing wrappers around its phases
# ------------------------------------------------------------------------------------------------


def make_trl_trainer(model, tok, examples, system, a, total_steps: int, out_dir: str, on_trl_step):
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from arpo.rewards import arpo_reward

    def arpo_reward_fn(prompts, completions, completion_ids, answers, task, **_):
        # the same reward arpo computes, on the same text arpo scores (the decoded completion tokens)
        return [float(arpo_reward(tok.decode(ids), {"answers": ans, "task": tk}, tool_calls=[],
                                  math_scorer="math_equal").reward)
                for ids, ans, tk in zip(completion_ids, answers, task, strict=True)]

    rows = [{"prompt": [{"role": "system", "content": system}, {"role": "user", "content": ex["question"]}],
             "answers": list(ex["answers"]), "task": ex["task"], "id": ex["id"]} for ex in examples]
    ds = Dataset.from_list(rows)
    n = len(examples)
    mb = a.trl_micro_batch or n * a.g
    if mb < 1 or (n * a.g) % mb:
        raise SystemExit(f"--trl-micro-batch {mb} must divide prompts x G = {n * a.g}")
    cfg = GRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, report_to="none", seed=a.seed,
        # one optimizer step = all prompts x G completions, generated in one batch (generation_batch_size =
        # per_device_train_batch_size x steps_per_generation, steps_per_generation = gradient_accumulation_steps);
        # forward/backward in micro-batches of `trl_micro_batch` rows (all 16 rows at once: out of memory here)
        max_steps=total_steps, per_device_train_batch_size=mb, gradient_accumulation_steps=n * a.g // mb,
        num_generations=a.g, max_completion_length=a.max_len, temperature=a.temperature, top_p=1.0, top_k=0,
        learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch", weight_decay=0.01,
        adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, beta=0.0, num_iterations=1,
        gradient_checkpointing=a.trl_gradient_checkpointing, logging_steps=10**6, save_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, log_completions=False,
    )
    times: dict[str, float] = {}
    counts: dict[str, float] = {}

    def timed(name, fn):
        def w(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                times[name] = times.get(name, 0.0) + time.perf_counter() - t
        return w

    class Timed(GRPOTrainer):
        def _generate(self, *args, **kw):  # tokenize prompts + model.generate + decode
            return timed("generation", super()._generate)(*args, **kw)

        def _calculate_rewards(self, *args, **kw):
            return timed("rewards", super()._calculate_rewards)(*args, **kw)

        def _generate_and_score_completions(self, *args, **kw):
            out = timed("generate_and_score", super()._generate_and_score_completions)(*args, **kw)
            counts["generated_tokens"] = int(out["completion_mask"].sum())
            counts["trained_tokens"] = int(out["completion_mask"].numel() + out["prompt_mask"].numel())
            return out

        def compute_loss(self, *args, **kw):  # forward (full logits of prompt+completion rows) + loss
            return timed("forward_loss", super().compute_loss)(*args, **kw)

        def training_step(self, *args, **kw):  # _prepare_inputs (generation etc.) + compute_loss + backward
            return timed("training_step", super().training_step)(*args, **kw)

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            times.clear()
            counts.clear()
            self.rss = RssPeak().__enter__()
            self.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            self.t_pre = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kw):
            self.t_opt = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            t_end = time.perf_counter()
            self.rss.__exit__(None, None, None)
            total = t_end - self.t0
            g, gs = times.get("generation", 0.0), times.get("generate_and_score", 0.0)
            split = {"generation": g, "rewards": times.get("rewards", 0.0),
                     "advantages_other": gs - g - times.get("rewards", 0.0),
                     "forward_loss": times.get("forward_loss", 0.0),
                     "backward": times.get("training_step", 0.0) - gs - times.get("forward_loss", 0.0),
                     "grad_clip_other": self.t_pre - self.t0 - times.get("training_step", 0.0),
                     "optimizer": t_end - self.t_pre}
            on_trl_step({"seconds": total, "split": split, "peak_rss_increase_gb": self.rss.increase_gb, **counts})

    trainer = Timed(model=model, reward_funcs=arpo_reward_fn, args=cfg, train_dataset=ds, processing_class=tok,
                    callbacks=[StepTimer()])
    return trainer


def _med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _gen_train(runs: list[dict]) -> dict:
    """Median generation time and the rest of the step (rewards, advantages, log-probs, loss, backward,
    optimizer), the split `arpo train` logs as time_generation / time_training."""
    return {"generation_s": round(statistics.median(r["split"]["generation"] for r in runs), 3),
            "training_s": round(statistics.median(r["seconds"] - r["split"]["generation"] for r in runs), 3)}


def _split_med(runs: list[dict]) -> dict:
    return {k: round(statistics.median(r["split"][k] for r in runs), 3) for k in runs[0]["split"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--data", default="gsm8k:train", help="a data spec: built-in name, file or hf:...")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--g", type=int, default=4, help="group size (completions per prompt)")
    ap.add_argument("--max-len", type=int, default=64, help="max completion tokens")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--repeats", type=int, default=3, help="measured steps per side (after one warm-up step)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared machine, 2 alone)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trl-gradient-checkpointing", action="store_true",
                    help="TRL's GRPOConfig default (slower); off by default")
    ap.add_argument("--trl-micro-batch", type=int, default=4,
                    help="TRL rows per forward/backward (gradient accumulation over prompts x G / this; 0: all)")
    ap.add_argument("--recompute-old-logprobs", action="store_true",
                    help="arpo: a no-grad forward for old_logp (arpo train old_logprobs=recompute) instead of the "
                         "engine's recorded log-probs (the default, old_logprobs=auto)")
    ap.add_argument("--quick", action="store_true", help="one measured step per side")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.repeats = 1
    try:
        import trl
    except ImportError:
        res = {"skipped": SKIP_REASON}
        print(json.dumps(res) if a.json else json.dumps(res, indent=1))
        return 0

    import torch
    import transformers

    from arpo.data.datasets import load_examples
    from arpo.data.prompts import prompts_for, system_prompt
    from arpo.models import load_model

    torch.set_num_threads(a.threads)
    data = a.data
    load0 = os.getloadavg()
    examples = load_examples(data, a.prompts)
    model_arpo, tok = load_model(a.model, "cpu", "float32")
    model_trl, tok_trl = load_model(a.model, "cpu", "float32")
    torch.manual_seed(a.seed)
    prompts = prompts_for(examples, tok, ["python"], None)  # arpo's GSM8K prompt (the `math` template)
    system = system_prompt("math", ["python"])
    trl_ids = tok.apply_chat_template([[{"role": "system", "content": system},
                                        {"role": "user", "content": e["question"]}]
                                       for e in examples], add_generation_prompt=True, tokenize=True,
                                      return_dict=True)["input_ids"]
    same_prompts = [list(x) for x in trl_ids] == prompts
    if not same_prompts:
        raise SystemExit("bench_trl: TRL's rendered prompts differ from arpo's; the comparison would not be fair")

    total = 1 + a.repeats
    arpo = ArpoStep(model_arpo, tok, examples, prompts, a, total)
    arpo_runs, trl_runs = [], []

    def after_trl_step(r):  # alternate: TRL step k, then arpo step k
        trl_runs.append(r)
        with RssPeak() as rss:
            ar = arpo.step(len(arpo_runs))
        ar["peak_rss_increase_gb"] = rss.increase_gb
        arpo_runs.append(ar)
        if not a.json:
            print(f"pair {len(trl_runs)}{' (warm-up)' if len(trl_runs) == 1 else ''}: TRL {r['seconds']:.1f} s, "
                  f"arpo {ar['seconds']:.1f} s", file=sys.stderr, flush=True)

    try:
        with tempfile.TemporaryDirectory(prefix="bench_trl-") as out_dir:
            trainer = make_trl_trainer(model_trl, tok_trl, examples, system, a, total, out_dir, after_trl_step)
            with contextlib.redirect_stdout(sys.stderr):  # Trainer prints its log dicts; keep stdout JSON only
                trainer.train()
    finally:
        arpo.tools.close()
    load1 = os.getloadavg()
    arpo_m, trl_m = arpo_runs[1:], trl_runs[1:]
    a_s, t_s = _med(arpo_m, "seconds"), _med(trl_m, "seconds")
    a_tok, t_tok = _med(arpo_m, "generated_tokens"), _med(trl_m, "generated_tokens")
    res = {
        "settings": {"model": a.model, "dtype": "float32", "device": "cpu", "prompts": a.prompts, "group_size": a.g,
                     "max_completion_length": a.max_len, "temperature": a.temperature, "lr": a.lr,
                     "repeats": a.repeats, "warmup_steps": 1, "threads": a.threads,
                     "threads_after": torch.get_num_threads(),
                     "same_prompt_ids": same_prompts, "prompt_tokens": [len(p) for p in prompts],
                     "tools": False,
                     "tools_reason": "TRL's tool mode needs JSON function calls through a tool-calling chat template; "
                                     "SmolLM2's template does not support tools and TRL cannot stop at arpo's "
                                     "<python> tags, so both sides run without tools",
                     "arpo_preset": "grpo", "trl_loss_type": "dapo (TRL default)",
                     "trl_gradient_checkpointing": a.trl_gradient_checkpointing,
                     "trl_micro_batch_rows": a.trl_micro_batch or a.prompts * a.g,
                     "arpo_micro_tokens": 4096,
                     "trl": trl.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
                     "loadavg_start": [round(x, 2) for x in load0], "loadavg_end": [round(x, 2) for x in load1]},
        "arpo": {"step_s": a_s, "steps_s": [round(r["seconds"], 2) for r in arpo_m],
                 "warmup_s": round(arpo_runs[0]["seconds"], 2), **_gen_train(arpo_m), "split_s": _split_med(arpo_m),
                 "generated_tokens": a_tok, "trained_tokens": _med(arpo_m, "trained_tokens"),
                 "peak_rss_increase_gb": round(max(r["peak_rss_increase_gb"] for r in arpo_runs[1:]), 2),
                 "warmup_peak_rss_increase_gb": round(arpo_runs[0]["peak_rss_increase_gb"], 2)},
        "trl": {"step_s": t_s, "steps_s": [round(r["seconds"], 2) for r in trl_m],
                "warmup_s": round(trl_runs[0]["seconds"], 2), **_gen_train(trl_m), "split_s": _split_med(trl_m),
                "generated_tokens": t_tok, "trained_tokens": _med(trl_m, "trained_tokens"),
                "peak_rss_increase_gb": round(max(r["peak_rss_increase_gb"] for r in trl_runs[1:]), 2),
                 "warmup_peak_rss_increase_gb": round(trl_runs[0]["peak_rss_increase_gb"], 2)},
        "ratio": a_s / t_s,
        # each pair ran back to back, so its ratio is less exposed to load drift than the ratio of medians
        "pair_ratios": [round(x["seconds"] / y["seconds"], 3) for x, y in zip(arpo_m, trl_m, strict=True)],
        "median_pair_ratio": statistics.median(x["seconds"] / y["seconds"] for x, y in zip(arpo_m, trl_m, strict=True)),
        "per_token_ratio": (a_s / max(a_tok, 1)) / (t_s / max(t_tok, 1)),
        "goal": "<= 0.5",
    }
    res["goal_met"] = res["ratio"] <= 0.5
    print(json.dumps(res) if a.json else json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
