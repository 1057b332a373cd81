"""The figures of `arpo experiment hop2-arpo-vs-grpo` (experiments/hop2.py), from its results.json:

* `hop2_accuracy.png`: dev accuracy against RL steps and against the tool calls training issued,
  per method the seed mean with a ±1 sample-sd band and each seed as a thin line;
* `hop2_branching.png`: does entropy rise after tool results (share of ΔH > 0 after result 1 and
  2), and do branches change outcomes (branch_outcome_differs next to the fresh-sample yardstick
  global_pairs_differ), per method (analysis/branches.py).
"""

from __future__ import annotations

import statistics
from pathlib import Path

COLORS = {"arpo": "tab:red", "grpo": "tab:blue", "aepo": "tab:green"}


def curve_stats(rs: list[dict]) -> dict[str, list[float]]:
    """Per eval point over seeds: step, mean accuracy, sample sd (0 for one seed), mean tool calls."""
    n = min(len(r["curve"]) for r in rs)
    pts = [[r["curve"][i] for r in rs] for i in range(n)]
    return {"step": [p[0]["step"] for p in pts],
            "mean": [statistics.fmean(q["accuracy"] for q in p) for p in pts],
            "sd": [statistics.stdev(q["accuracy"] for q in p) if len(p) > 1 else 0.0 for p in pts],
            "tool_calls": [statistics.fmean(q["tool_calls"] for q in p) for p in pts]}


def plot(results: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, xkey, xlabel in ((axes[0], "step", "RL step"),
                             (axes[1], "tool_calls", "tool calls issued in training rollouts (cumulative)")):
        for m, rs in runs.items():
            c = curve_stats(rs)
            for r in rs:
                ax.plot([p[xkey] for p in r["curve"]], [p["accuracy"] for p in r["curve"]], color=COLORS.get(m),
                        alpha=0.3, lw=1)
            xs = c[xkey]
            ax.plot(xs, c["mean"], color=COLORS.get(m), lw=2, marker="o", ms=3,
                    label=f"{m.upper()} (mean of {len(rs)} seeds, ±1 sd)")
            ax.fill_between(xs, [a - s for a, s in zip(c["mean"], c["sd"], strict=True)],
                            [a + s for a, s in zip(c["mean"], c["sd"], strict=True)], color=COLORS.get(m), alpha=0.15)
        ax.axhline(results["start_dev"]["accuracy"], color="gray", ls=":", lw=1, label="SFT start")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"dev accuracy (greedy, {results['settings']['eval_data']})")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    paths.append(out / "hop2_accuracy.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    br = results.get("branching") or {}
    if br:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
        methods = list(br)
        w = 0.8 / max(1, len(methods))
        for k, m in enumerate(methods):
            e = br[m]["pooled"]["entropy_after_results"]
            js = sorted(e, key=int)
            axes[0].bar([int(j) + (k - (len(methods) - 1) / 2) * w for j in js], [e[j]["share_rising"] for j in js],
                        w, color=COLORS.get(m), label=m.upper())
        axes[0].set_xticks(sorted({int(j) for m in methods for j in br[m]["pooled"]["entropy_after_results"]}))
        axes[0].axhline(0.5, color="gray", ls=":", lw=1)
        axes[0].set_xlabel("tool result")
        axes[0].set_ylabel("share of global samples with ΔH > 0")
        axes[0].set_title("does entropy rise after tool results? (all training steps)", fontsize=9)
        shown = [m for m in methods if br[m]["pooled"]["branches"]]
        js = sorted({j for m in shown for j in br[m]["pooled"]["by_result"]}, key=int)
        pooled = [br[m]["pooled"] for m in shown]
        bars: list[tuple[str, list[float | None], float | None]] = [  # label, a value per method, alpha (None: gray)
            (f"branch after result {j}", [(p["by_result"].get(j) or {}).get("branch_outcome_differs") for p in pooled],
             0.35 + 0.5 * i / max(1, len(js))) for i, j in enumerate(js)]
        bars.append(("two fresh samples", [p["global_pairs_differ"] for p in pooled], None))
        w = 0.8 / len(bars)
        for b, (label, vals, alpha) in enumerate(bars):
            for x, (m, v) in enumerate(zip(shown, vals, strict=True)):
                axes[1].bar(x + (b - (len(bars) - 1) / 2) * w, v or 0.0, w, alpha=alpha or 1.0,
                            color=COLORS.get(m) if alpha else "lightgray", label=label if x == 0 else None)
        axes[1].set_xticks(range(len(shown)), [f"{m.upper()}\n{br[m]['pooled']['branches']} branches" for m in shown])
        axes[1].set_ylabel("share with different correctness")
        axes[1].set_title("do branches change outcomes?", fontsize=9)
        for ax in axes:  # headroom so that the legend sits above the bars
            ax.set_ylim(0, 1.45 * max([0.1] + [p.get_height() for p in ax.patches]))
            ax.grid(alpha=0.3, axis="y")
            ax.legend(fontsize=8, ncol=2, loc="upper left")
        fig.tight_layout()
        paths.append(out / "hop2_branching.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths
