"""ARPO vs GRPO on the knowledge-base tool environment (experiments/kbenv.py), several seeds each.

    arpo experiment arpo-vs-grpo [--seeds 3] [--steps 40] [--out DIR] [--quick]

The pipeline, all of it arpo's own code:

    KB + BM25 index (retrieval/index.py) ─► questions (train / dev / held-out eval)
      ─► expert traces through the real python + search tools ─► tokenizer (BPE on the env's texts)
      ─► random-weight Llama ─► cold-start SFT (recipes/sft.py), stopped at *partial* competence:
         the first check where greedy dev accuracy ≥ `sft_target`
      ─► for method in (arpo, grpo), for seed in seeds: RL with recipes/train.run
         (same prompts per step, same M trajectories per prompt, same lr and steps; ARPO starts
         N < M global samples and branches after tool results, GRPO starts all M)
      ─► every `eval_every` steps (eval/evaluate.py, tools uncounted): accuracy on the RL task set
         (pass@1 over `eval_samples` samples at the training temperature: the learning curve) and
         greedy pass@1 on held-out questions of the same environment (never trained on)
      ─► results.json, accuracy_vs_step.png, accuracy_vs_tool_calls.png

RL runs as consecutive `train.run(..., resume=True)` segments of `eval_every` steps (resume is
exact: prompts, rollout seeds and optimizer state are restored from the checkpoint), so the
held-out evaluation sits between segments and its tool calls are never counted.

Tool calls are counted where the agent loop hands them to the tool registry: every call the
policy issued during a training rollout. A branch inherits its parent's earlier calls (the shared
prefix is not re-run), so it only adds the calls it makes itself; that saving is ARPO's claim.
Identical calls answered by arpo's tool cache still count: the policy made them.

Tool-call ratio: the *target* accuracy X is the highest level that both methods' seed-mean curves
reach (min of their maxima); for each method, the cumulative tool calls at which its seed-mean
accuracy-vs-calls curve first reaches X (linear interpolation between evaluations); ratio =
calls(ARPO) / calls(GRPO). The same is reported at 25/50/75 % of the way from the SFT accuracy to
X, and per seed pair (ARPO seed s vs GRPO seed s, X_s from that pair).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import arpo.models
from arpo.errors import ArpoError, require
from arpo.eval.evaluate import evaluate
from arpo.provenance import provenance
from arpo.rewards import arpo_reward
from arpo.settings import (
    AgentConfig,
    AlgoConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    RunConfig,
    SFTConfig,
    SFTDataConfig,
    ToolsConfig,
    TrainConfig,
    TrainRunConfig,
)
from arpo.tools import tools_from_config
from arpo.tools.registry import ToolRegistry
from arpo.training.logger import read_metrics
from experiments import kbenv
from experiments.common import (
    check_methods,
    log,
    recorded_settings,
    run_dir_of,
    start_run,
    stop_if_signalled,
    summarize,
)


@dataclass
class ExperimentConfig:
    out: str = "runs/experiments/arpo_vs_grpo"  # results.json, the PNGs, env/, sft/, rl/
    methods: list[str] = field(default_factory=lambda: ["arpo", "grpo"])  # algo presets (algos/presets.py)
    seeds: int = 3  # RL seeds per method (0 .. seeds-1)
    threads: int = 2  # torch CPU threads
    # environment (kbenv.py)
    env_seed: int = 0
    n_towns: int = 40
    n_sft: int = 800  # expert traces for SFT
    n_train: int = 64  # the RL task set: the questions RL trains on (each seen steps*prompts_per_step/n_train times)
    n_dev: int = 64  # decides when SFT stops
    n_eval: int = 128  # held-out questions (never trained on), greedy pass@1: the secondary curve
    top_k: int = 1  # search pages per call (2: the second page is a distractor town)
    # model (a small Llama, random init)
    vocab_size: int = 512
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    intermediate: int = 256  # MLP width
    # SFT (recipes/sft.py), constant lr after warmup, checked every sft_check_every steps
    sft_lr: float = 5e-3
    sft_batch: int = 16
    sft_warmup: int = 20
    sft_check_every: int = 50
    sft_max_steps: int = 1000
    sft_target: float = 0.3  # stop at the first check with dev accuracy >= this (partial competence)
    sft_from: str | None = None  # reuse this SFT model dir (skips SFT; for development)
    # RL (recipes/train.py), identical for every method but the preset
    steps: int = 40
    eval_every: int = 5
    eval_samples: int = 4  # samples per RL-task question for the learning curve (pass@1 = their mean)
    prompts_per_step: int = 8
    group_size: int = 8  # M trajectories per prompt, all methods
    initial_rollouts: int = 4  # N global samples of ARPO (GRPO: N = M)
    lr: float = 1e-3
    ppo_epochs: int = 1  # passes over each rollout batch
    minibatches: int = 1  # optimizer steps per pass
    warmup_steps: int = 5  # linear lr warmup (Adam's first steps are sign-like and break a tiny model)
    temperature: float = 1.0
    max_tool_calls: int = 5
    max_response_tokens: int = 320

    def validate(self) -> None:
        for key in ("seeds", "steps", "threads", "eval_every"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        check_methods(self.methods)

    @classmethod
    def quick(cls, **over) -> ExperimentConfig:
        """A smoke-test size: 1 seed, a few steps, a smaller model and env (not a result)."""
        base: dict[str, Any] = dict(
                    seeds=1, n_towns=20, n_sft=160, n_dev=16, n_eval=16, hidden=64, layers=2, intermediate=128,
                    sft_batch=16, sft_lr=3e-3, sft_warmup=5, sft_check_every=30, sft_max_steps=30,
                    sft_target=1.1, steps=4, eval_every=2, prompts_per_step=2, max_response_tokens=256, n_train=16,
                    eval_samples=2)
        base.update(over)
        return cls(**base)


# ---- tool-call counting --------------------------------------------------------------------------
class CountingRegistry(ToolRegistry):
    """The tools of `inner`, counting every call handed to `run` (thread-safe). `close` is a no-op:
    the registry outlives the train.run segments; the experiment closes `inner` at the end."""

    def __init__(self, inner: ToolRegistry):
        super().__init__([inner[n] for n in inner.names])
        self.counts: Counter = Counter()
        self._lock = threading.Lock()

    def run(self, call):
        r = super().run(call)
        with self._lock:
            self.counts["calls"] += 1
            self.counts[f"calls/{call.tag if call.tag in self and call.error is None else 'malformed'}"] += 1
            self.counts["executed"] += not r.cached
        return r

    def close(self) -> None:
        pass


class CountingToolsConfig(ToolsConfig):
    """A ToolsConfig whose build() hands train.run the experiment's CountingRegistry (set as the
    attribute `registry`, which is not a config field, so the saved config.yaml stays plain: the
    class is deliberately not a dataclass of its own, its fields are ToolsConfig's)."""

    registry: CountingRegistry

    def build(self):
        return self.registry


# ---- the stages ----------------------------------------------------------------------------------
def prepare_env(cfg: ExperimentConfig, out: Path) -> dict:
    """KB, index, question sets and expert SFT traces; returns paths, examples and counts."""
    kb = kbenv.make_kb(cfg.n_towns, cfg.env_seed)
    env = out / "env"
    kbenv.build_index(kb, env / "index")
    tools = tools_from_config(kbenv.tools_config(env / "index", cfg.top_k))
    ev = kbenv.make_questions(kb, cfg.n_eval, seed=1, prefix="eval")
    dev = kbenv.make_questions(kb, cfg.n_dev, seed=2, exclude={q["question"] for q in ev}, prefix="dev")
    held = {q["question"] for q in ev + dev}
    train = kbenv.make_questions(kb, cfg.n_train, seed=3, exclude=held, prefix="train")
    sft_q = kbenv.make_questions(kb, cfg.n_sft, seed=4, exclude=held, prefix="sft")
    rows, dropped = kbenv.sft_rows(sft_q, tools)
    for name, data in (("eval", ev), ("dev", dev), ("train", train), ("sft", rows)):
        kbenv.write_jsonl(data, env / f"{name}.jsonl")
    (env / "kb.json").write_text(json.dumps([dataclasses.asdict(t) for t in kb.towns], indent=1))
    return {"kb": kb, "tools": tools, "eval": ev, "dev": dev, "train": train, "sft_rows": rows,
            "sft_dropped": dropped, "dir": env}


def agent_config(cfg: ExperimentConfig):
    return AgentConfig(max_tool_calls=cfg.max_tool_calls, max_response_tokens=cfg.max_response_tokens,
                       temperature=cfg.temperature)


def evaluate_model(model_dir, examples, tools, cfg: ExperimentConfig, samples: int = 1, temperature: float = 0.0,
                   loaded=None) -> dict:
    """pass@1 and friends on `examples` (arpo's evaluator, uncounted tools); greedy by default."""
    from arpo.engine.hf import HFEngine  # noqa: PLC0415 - loads torch; kept out of this light module's import

    model, tok = loaded or arpo.models.load_model(str(model_dir), device="cpu", dtype="float32")
    recs: list = []
    m = evaluate(HFEngine(model, tok), tools, tok, examples, reward_fn=arpo_reward, agent=agent_config(cfg),
                 samples=samples, temperature=temperature, template="both", tool_names=["python", "search"],
                 batch_size=min(256, len(examples) * samples), records_out=recs, seed=cfg.env_seed)
    by_kind: dict[str, list[bool]] = {}
    kind = {ex["id"]: ex["kind"] for ex in examples}
    for r in recs:
        by_kind.setdefault(kind[r["example_id"]], []).append(r["correct"])
    m["accuracy_by_kind"] = {k: statistics.fmean(v) for k, v in sorted(by_kind.items())}
    return m


def measure(model_dir, env: dict, cfg: ExperimentConfig) -> dict:
    """One point of a learning curve: accuracy on the RL task set (pass@1 over eval_samples samples
    at the training temperature: the policy RL optimizes) and greedy accuracy on the held-out set."""
    loaded = arpo.models.load_model(str(model_dir), device="cpu", dtype="float32")
    task = evaluate_model(model_dir, env["train"], env["tools"], cfg, samples=cfg.eval_samples,
                          temperature=cfg.temperature, loaded=loaded)
    held = evaluate_model(model_dir, env["eval"], env["tools"], cfg, loaded=loaded)
    return {"accuracy": task["pass@1"], "format_error_rate": task["format_error_rate"],
            "tool_calls_per_answer": task["tool_calls"], "accuracy_by_kind": task["accuracy_by_kind"],
            "heldout_accuracy": held["pass@1"], "heldout_format_error_rate": held["format_error_rate"],
            "heldout_accuracy_by_kind": held["accuracy_by_kind"]}


def train_sft(cfg: ExperimentConfig, env: dict, out: Path) -> dict:
    """Tokenizer + random Llama, then arpo's SFT recipe in segments until dev accuracy >= target."""
    import torch  # noqa: PLC0415 - loads torch; kept out of this light module's import

    from arpo.recipes.sft import run as sft_run  # noqa: PLC0415 - loads torch; kept out of this light module's import

    tok = kbenv.build_tokenizer(kbenv.tokenizer_corpus(env["kb"], env["sft_rows"], env["train"]), cfg.vocab_size)
    model = kbenv.build_model(tok, cfg.hidden, cfg.layers, cfg.heads, cfg.intermediate, seed=cfg.env_seed)
    init = out / "init_model"
    model.save_pretrained(init)
    tok.save_pretrained(init)
    n_params = sum(p.numel() for p in model.parameters())
    sft_dir = out / "sft"
    shutil.rmtree(sft_dir, ignore_errors=True)
    scfg = SFTConfig(
        model=ModelConfig(name=str(init), device="cpu", dtype="float32"),
        data=SFTDataConfig(path=[str(env["dir"] / "sft.jsonl")], max_seq_len=cfg.max_response_tokens + 64),
        optim=OptimConfig(lr=cfg.sft_lr, schedule="constant", warmup_steps=cfg.sft_warmup, weight_decay=0.0),
        run=RunConfig(dir=str(sft_dir), seed=cfg.env_seed, save_every=0, keep_checkpoints=1, tensorboard=False,
                      threads=cfg.threads),
        prompts_per_step=cfg.sft_batch,
    )
    if cfg.sft_max_steps < 1:
        raise ArpoError(f"sft_max_steps must be >= 1, got {cfg.sft_max_steps}")
    checks: list[dict] = []
    res: dict = {}
    step = 0
    t0 = time.perf_counter()
    while step < cfg.sft_max_steps:
        step = min(step + cfg.sft_check_every, cfg.sft_max_steps)
        scfg.steps = step
        res = stop_if_signalled(sft_run(scfg, resume=step > cfg.sft_check_every, quiet=True))
        dev = evaluate_model(res["model"], env["dev"], env["tools"], cfg)
        checks.append({"step": step, "loss": res["final_loss"], "dev_accuracy": dev["pass@1"],
                       "dev_format_error_rate": dev["format_error_rate"]})
        log(f"sft step {step}: loss {res['final_loss']:.3f} dev acc {dev['pass@1']:.3f} "
            f"format errors {dev['format_error_rate']:.2f}")
        if dev["pass@1"] >= cfg.sft_target:
            break
    torch.set_num_threads(cfg.threads)
    return {"model": res["model"], "steps": step, "checks": checks, "rows": res["rows"], "params": n_params,
            "vocab": len(tok), "seconds": time.perf_counter() - t0}


def run_rl(cfg: ExperimentConfig, method: str, seed: int, sft_model: str, env: dict, out: Path,
           start_eval: dict) -> dict:
    """One RL run with recipes/train.run in segments of eval_every steps; the learning curve."""
    from arpo.recipes import train  # noqa: PLC0415 - loads torch+numpy; kept out of this light module's import

    run_dir = run_dir_of(out, method, seed)
    shutil.rmtree(run_dir, ignore_errors=True)
    counting = CountingRegistry(env["tools"])
    tools_cfg = kbenv.tools_config(env["dir"] / "index", cfg.top_k, cls=CountingToolsConfig)
    tools_cfg.registry = counting
    tcfg = TrainConfig(
        model=ModelConfig(name=sft_model, device="cpu", dtype="float32"),
        data=DataConfig(path=str(env["dir"] / "train.jsonl"), task="math", template="both"),
        tools=tools_cfg, agent=agent_config(cfg),
        rollout=RolloutConfig(group_size=cfg.group_size, initial_rollouts=cfg.initial_rollouts, seed=seed),
        algo=AlgoConfig(preset=method, ppo_epochs=cfg.ppo_epochs),
        optim=OptimConfig(lr=cfg.lr, warmup_steps=cfg.warmup_steps),
        run=TrainRunConfig(dir=str(run_dir), seed=seed, save_every=cfg.eval_every, keep_checkpoints=1,
                                 tensorboard=False, threads=cfg.threads),
        steps=cfg.eval_every, prompts_per_step=cfg.prompts_per_step, minibatches=cfg.minibatches,
    )
    curve = [{"step": 0, "tool_calls": 0, "executed_tool_calls": 0, **start_eval, "seconds": 0.0}]
    t0 = time.perf_counter()
    for end in range(cfg.eval_every, cfg.steps + 1, cfg.eval_every):
        tcfg.steps = end
        res = stop_if_signalled(train.run(tcfg, resume=end > cfg.eval_every, quiet=True))
        ev = measure(Path(res["checkpoint"]) / "model", env, cfg)
        curve.append({"step": end, "tool_calls": counting.counts["calls"],
                      "executed_tool_calls": counting.counts["executed"], **ev, "seconds": time.perf_counter() - t0})
        log(f"{method} seed {seed} step {end}: task acc {ev['accuracy']:.3f}  held-out {ev['heldout_accuracy']:.3f}  "
            f"cumulative tool calls {counting.counts['calls']}  train reward "
            f"{res['final'].get('reward_mean', float('nan')):.3f}")
    rows = read_metrics(run_dir)
    keys = ("reward_mean", "accuracy", "format_error_rate", "tool_calls_per_traj", "branches", "trajectories",
            "response_length", "step_seconds", "initial_entropy", "post_tool_entropy")
    per_step = [{"step": r["step"], **{k: r[k] for k in keys if k in r}} for r in rows]
    return {"method": method, "seed": seed, "curve": curve, "per_step": per_step,
            "tool_calls_by_kind": {k: v for k, v in counting.counts.items() if k.startswith("calls/")},
            "branches_total": sum(r.get("branches", 0) for r in per_step),
            "trajectories_total": sum(r.get("trajectories", 0) for r in per_step),
            "seconds": time.perf_counter() - t0}


# ---- figures -------------------------------------------------------------------------------------
def plot(results: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"arpo": "tab:red", "grpo": "tab:blue"}
    summ, runs = results["summary"], results["runs"]
    paths = []
    for xkey, fname, xlabel in (("step", "accuracy_vs_step.png", "RL step"),
                                ("tool_calls", "accuracy_vs_tool_calls.png",
                                 "cumulative tool calls in training rollouts")):
        fig, ax = plt.subplots(figsize=(6.8, 4.2))
        for m, rs in runs.items():
            c = summ["curves"][m]
            col = colors.get(m)
            for r in rs:
                ax.plot([p[xkey] for p in r["curve"]], [p["accuracy"] for p in r["curve"]], color=col, alpha=0.25, lw=1)
            xs = c["step"] if xkey == "step" else c["tool_calls_mean"]
            lo = [mu - sd for mu, sd in zip(c["accuracy_mean"], c["accuracy_std"], strict=True)]
            hi = [mu + sd for mu, sd in zip(c["accuracy_mean"], c["accuracy_std"], strict=True)]
            ax.plot(xs, c["accuracy_mean"], color=col, lw=2, marker="o", ms=3,
                    label=f"{m.upper()} (mean of {len(rs)} seeds, band ±1 sd)")
            ax.fill_between(xs, lo, hi, color=col, alpha=0.15)
            if xkey == "step":
                ax.plot(xs, c["heldout_accuracy_mean"], color=col, lw=1.2, ls="--",
                        label=f"{m.upper()} held-out (greedy, seed mean)")
        ax.axhline(summ["start_accuracy"], color="gray", ls=":", lw=1, label="SFT start")
        if xkey == "tool_calls" and summ.get("target_accuracy") is not None and summ.get("tool_call_ratio"):
            lv = summ["ratio_levels"]["1.00"]
            ax.axhline(lv["accuracy"], color="black", ls="--", lw=0.8)
            ax.set_title(f"calls to reach acc {lv['accuracy']:.3f}: ARPO/GRPO = {summ['tool_call_ratio']:.2f}",
                         fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"RL task-set accuracy (pass@1, T={results['settings']['temperature']:g})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        p = out / fname
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths


# ---- the experiment ------------------------------------------------------------------------------
def run(cfg: ExperimentConfig) -> dict:
    out = start_run(cfg.out, cfg.threads)
    t0 = time.perf_counter()
    env = prepare_env(cfg, out)
    log(f"env: {cfg.n_towns} towns, {len(env['sft_rows'])} expert traces ({env['sft_dropped']} dropped), "
        f"{len(env['train'])} RL prompts, {len(env['eval'])} held-out")
    try:
        if cfg.sft_from:
            sft: dict[str, Any] = {"model": cfg.sft_from, "reused": True, "steps": None, "checks": [], "seconds": 0.0}
        else:
            sft = train_sft(cfg, env, out)
        start = measure(sft["model"], env, cfg)
        log(f"SFT model {sft['model']}: task acc {start['accuracy']:.3f}  held-out {start['heldout_accuracy']:.3f}")
        runs: dict[str, list[dict]] = {m: [] for m in cfg.methods}
        for seed in range(cfg.seeds):  # interleaved, so a cut-short run still has both methods
            for m in cfg.methods:
                runs[m].append(run_rl(cfg, m, seed, sft["model"], env, out, start))
    finally:
        env["tools"].close()
    results: dict[str, Any] = {
        "settings": recorded_settings(cfg),
        "environment": {"towns": cfg.n_towns, "sft_traces": len(env["sft_rows"]), "sft_dropped": env["sft_dropped"],
                        "kinds": list(kbenv.KINDS), "tools": ["search", "python"], "search_top_k": cfg.top_k},
        "sft": sft,
        "start_eval": start,
        "runs": runs,
    }
    results["summary"] = summarize(runs, start["accuracy"])
    results["wall_seconds"] = time.perf_counter() - t0
    results["machine"] = _machine()
    results["provenance"] = provenance()
    results["plots"] = [str(p) for p in plot(results, out)]
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    return results


def _machine() -> dict:
    import torch  # noqa: PLC0415 - loads torch; kept out of this light module's import

    return {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "load_average_at_end": os.getloadavg()}
