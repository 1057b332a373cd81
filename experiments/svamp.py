"""ARPO vs GRPO on SVAMP with the embedded SmolLM2-135M: the same SFT start, the same rollout budget.

    arpo experiment svamp-arpo-vs-grpo [--seeds 3] [--steps 30] [--out DIR] [key=value ...]

The pipeline, all of it arpo's own recipes and configs:

    SVAMP training problems ─► `arpo sft-data svamp` rows (real python runs) ─► SFT (sft_config)
      ─► held-out evaluation of the SFT model (greedy, eval_data: SVAMP test problems)
      ─► for seed in seeds, for method in methods: RL with recipes/train.run from train_config
         (identical but for algo.preset and run.seed: same RL problems, prompts per step, group size
         M, lr, steps; ARPO starts N < M global samples and branches after tool results, GRPO starts M)
      ─► every `eval_every` steps the run stops (an exact resume continues it) and the checkpoint is
         evaluated greedily on the held-out problems (its tool calls are not counted)
      ─► results.json, accuracy_vs_step.png, accuracy_vs_tool_calls.png, branch_rate.png

Tool calls are the training metric `tool_calls_issued` (training/rollout_metrics.py): every call a training
rollout ran, a branch's inherited prefix calls counted once — the saving ARPO claims. The analysis
(tool-call ratio at the highest accuracy both methods' seed means reach, also per seed pair) is
experiments/common.summarize; each run's final checkpoint is also compared with the SFT start
question by question (eval/paired.py: newly solved vs newly failed).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arpo.config import load_config
from arpo.data.datasets import load_examples
from arpo.recipes.sft_data import build_sft_dataset
from arpo.settings import SFTConfig
from experiments.common import (
    RLStudyConfig,
    cached_eval,
    log,
    point,
    recorded_settings,
    run_record,
    run_rl,
    start_run,
    stop_if_signalled,
    summarize,
    train_config,
)


@dataclass
class SvampExperimentConfig(RLStudyConfig):
    """common.RLStudyConfig with SVAMP's data and RL config (its other defaults are SVAMP's too)."""

    out: str = "runs/experiments/svamp_arpo_vs_grpo"  # results.json, PNGs, sft/, rl/
    sft_data: str = "svamp:train[0:160]"  # `arpo sft-data svamp` rows made from these problems
    train_config: str = "configs/svamp_rl.yaml"
    eval_data: str = "svamp:test[0:300]"  # held-out SVAMP test problems, never trained on

    @classmethod
    def quick(cls, **over) -> SvampExperimentConfig:
        """A smoke-test size on the tiny random model (plumbing, not a result)."""
        base: dict[str, Any] = dict(
                    seeds=1, sft_data="svamp:train[0:8]", eval_data="svamp:test[0:4]", steps=2, eval_every=2,
                    sft_overrides=["model.name=tiny-random", "steps=2", "prompts_per_step=4"],
                    train_overrides=["prompts_per_step=2", "rollout.group_size=4", "rollout.initial_rollouts=2",
                                     "agent.max_response_tokens=24", "rollout.branch_threshold=0.0"])
        base.update(over)
        return cls(**base)


def make_sft(cfg: SvampExperimentConfig, out: Path) -> dict:
    from arpo.recipes.sft import run as sft_run  # noqa: PLC0415 - loads torch; kept out of this light module's import

    data = out / "sft_svamp.jsonl"
    stats = build_sft_dataset("svamp", cfg.sft_data, str(data), progress=False)
    over = list(cfg.sft_overrides) + [f"data.path=[{data}]", f"run.dir={out / 'sft'}", f"run.threads={cfg.threads}",
                                      "run.tensorboard=false"]
    sc = load_config(SFTConfig, cfg.sft_config, over)
    t0 = time.perf_counter()
    res = stop_if_signalled(sft_run(sc, overwrite=True, quiet=True))
    return {"model": res["model"], "data": stats, "steps": res["steps"], "final_loss": res["final_loss"],
            "seconds": time.perf_counter() - t0}


def seed_spread(summary: dict) -> dict:
    """Mean, sd, min and max over seed pairs of the per-pair tool-call ratio (pairs with a ratio)."""
    rs = [p["ratio"] for p in summary.get("per_seed_ratio", []) if p.get("ratio") is not None]
    if not rs:
        return {"n": 0}
    return {"n": len(rs), "mean": statistics.fmean(rs), "sd": statistics.stdev(rs) if len(rs) > 1 else 0.0,
            "min": min(rs), "max": max(rs)}  # sample sd (ddof 1): seeds are a sample


def plot(results: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"arpo": "tab:red", "grpo": "tab:blue"}
    summ, runs = results["summary"], results["runs"]
    paths = []
    for xkey, fname, xlabel in (
            ("step", "accuracy_vs_step.png", "RL step"),
            ("tool_calls", "accuracy_vs_tool_calls.png", "cumulative tool calls in training rollouts")):
        fig, ax = plt.subplots(figsize=(6.8, 4.2))
        for m, rs in runs.items():
            c = summ["curves"][m]
            for r in rs:
                ax.plot([p[xkey] for p in r["curve"]], [p["accuracy"] for p in r["curve"]], color=colors.get(m),
                        alpha=0.3, lw=1)
            xs = c["step"] if xkey == "step" else c["tool_calls_mean"]
            lo = [mu - sd for mu, sd in zip(c["accuracy_mean"], c["accuracy_std"], strict=True)]
            hi = [mu + sd for mu, sd in zip(c["accuracy_mean"], c["accuracy_std"], strict=True)]
            ax.plot(xs, c["accuracy_mean"], color=colors.get(m), lw=2, marker="o", ms=3,
                    label=f"{m.upper()} (mean of {len(rs)} seeds, band ±1 sd)")
            ax.fill_between(xs, lo, hi, color=colors.get(m), alpha=0.15)
        ax.axhline(summ["start_accuracy"], color="gray", ls=":", lw=1, label="SFT start")
        if xkey == "tool_calls" and summ.get("tool_call_ratio"):
            lv = summ["ratio_levels"]["1.00"]
            ax.axhline(lv["accuracy"], color="black", ls="--", lw=0.8)
            ax.set_title(f"calls to reach {lv['accuracy']:.3f}: ARPO/GRPO = {summ['tool_call_ratio']:.2f}", fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"held-out SVAMP accuracy (greedy, {results['eval_questions']} questions)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        paths.append(out / fname)
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for m, rs in runs.items():
        for r in rs:
            st = [p["step"] for p in r["per_step"]]
            axes[0].plot(st, [p.get("accuracy", 0.0) for p in r["per_step"]], color=colors.get(m), alpha=0.5, lw=1,
                         label=m.upper() if r is rs[0] else None)
            if any(p.get("branch_decisions") for p in r["per_step"]):
                axes[1].plot(st, [p.get("branch_rate", 0.0) for p in r["per_step"]], color=colors.get(m), alpha=0.6,
                             lw=1, label=f"{m.upper()} seed {r['seed']}")
    axes[0].set_title("training-rollout accuracy per step (T = train temperature)", fontsize=9)
    axes[1].set_title("branch rate per step (branched / branch decisions)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "training_and_branch_rate.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def _calls(v: float | None) -> str:
    """A tool-call count for the report table: rounded, or "never" when the accuracy was not reached."""
    return "never" if v is None else f"{v:.0f}"


def report(results: dict) -> str:
    """results.json as markdown tables (report.md next to it; docs/ quotes it)."""
    summ, runs = results["summary"], results["runs"]
    n = results["eval_questions"]
    lines = [f"Held-out accuracy (greedy, {n} questions of `{results['settings']['eval_data']}`) and cumulative "
             f"training tool calls; SFT start {summ['start_accuracy']:.3f}.", "",
             "| method | seed | " + " | ".join(f"step {p['step']}" for p in next(iter(runs.values()))[0]["curve"])
             + " | paired vs SFT (solves / fails) | branches / trajectories | reused steps |",
             "|---|---|" + "---|" * (len(next(iter(runs.values()))[0]["curve"]) + 3)]
    for m, rs in runs.items():
        for r in rs:
            cells = [f"{p['accuracy']:.3f} ({p['tool_calls']})" for p in r["curve"]]
            fv = r["final_vs_sft"]
            lines.append(f"| {m.upper()} | {r['seed']} | " + " | ".join(cells)
                         + f" | +{fv['wins']} / −{fv['losses']}"
                         + ((" (significant)" if fv["net"] > 0 else " (significant drop)") if fv["significant"] else "")
                         + f" | {r['branches_total']} / {r['trajectories_total']} | {r.get('reused_steps', [])} |")
    lines += ["", "| method | final accuracy mean ± sd | best mean | tool calls (mean, all steps) |",
              "|---|---|---|---|"]
    for m in runs:
        sm = summ.get(m, {})
        if sm:
            lines.append(f"| {m.upper()} | {sm['final_accuracy_mean']:.3f} ± {sm['final_accuracy_std']:.3f} | "
                         f"{sm['best_accuracy_mean']:.3f} | {sm['total_tool_calls_mean']:.0f} |")
    if "ratio_levels" in summ:
        lines += ["", "Tool calls to reach an accuracy (seed means, linear interpolation between evaluations):", "",
                  "| accuracy | ARPO calls | GRPO calls | ratio |", "|---|---|---|---|"]
        for lv in summ["ratio_levels"].values():
            lines.append(f"| {lv['accuracy']:.3f} | {_calls(lv.get('calls_arpo'))} | {_calls(lv.get('calls_grpo'))} | "
                         + ("n/a" if lv.get("ratio") is None else f"{lv['ratio']:.2f}") + " |")
        sp = summ.get("per_seed_ratio_spread", {})
        lines += ["", "Per seed pair (each pair's own highest common accuracy): "
                  + ", ".join(f"seed {p['seed']}: " + ("n/a" if p["ratio"] is None else f"{p['ratio']:.2f}")
                              + f" at {p['target_accuracy']:.3f}" for p in summ.get("per_seed_ratio", []))
                  + (f"; mean {sp['mean']:.2f}, sd {sp['sd']:.2f}, range {sp['min']:.2f}–{sp['max']:.2f}"
                     if sp.get("n") else "")
                  + "."]
    return "\n".join(lines) + "\n"


def run(cfg: SvampExperimentConfig) -> dict:
    out = start_run(cfg.out, cfg.threads)
    t0 = time.perf_counter()
    if cfg.sft_from:
        sft: dict[str, Any] = {"model": cfg.sft_from, "reused": True}
    else:
        sft = make_sft(cfg, out)
        log(f"SFT: {sft['data']['written']} rows, {sft['steps']} steps, loss {sft['final_loss']:.3f} "
            f"({sft['seconds']:.0f} s) -> {sft['model']}")
    examples = load_examples(cfg.eval_data)
    tc0 = train_config(cfg, sft["model"], cfg.methods[0], 0, out / "rl" / "_")
    m, recs = cached_eval(out, 0, sft["model"], tc0, cfg, examples)  # out/heldout_step_000000.json
    start = {"point": point(m, recs), "records": recs}
    log(f"SFT start: held-out {m['pass@1']:.3f} on {len(examples)} questions")
    runs: dict[str, list[dict]] = {mt: [] for mt in cfg.methods}
    for seed in range(cfg.seeds):  # interleaved: a cut-short run still has both methods
        for mt in cfg.methods:
            runs[mt].append(run_rl(cfg, mt, seed, sft["model"], examples, start, out))
    results: dict[str, Any] = {"settings": recorded_settings(cfg), "train_config": json.loads(json.dumps(
               dataclasses.asdict(tc0), default=str)), "sft": sft, "eval_questions": len(examples),
               "start": start["point"], "runs": runs}
    results["summary"] = summarize(runs, start["point"]["accuracy"])
    results["summary"]["per_seed_ratio_spread"] = seed_spread(results["summary"])
    results.update(run_record(t0))  # wall_seconds, load_average_at_end, provenance
    results["plots"] = [str(p) for p in plot(results, out)]
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "report.md").write_text(report(results))
    return results
