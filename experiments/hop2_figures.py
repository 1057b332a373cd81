"""The figures of `arpo experiment hop2-arpo-vs-grpo` and `branch-rules` (experiments/hop2_study.py), from
their results.json (`arpo experiment hop2-stats --results FILE` draws them again):

* `hop2_accuracy.png`: dev accuracy against RL steps and against the tool calls training issued,
  per arm the seed mean with a ±1 sample-sd band and each seed as a thin line; where the file has a
  `matched_calls` section (branch-rules), its budgets C as dotted verticals on the calls panel;
* `hop2_branching.png`: does entropy rise after tool results (share of ΔH > 0 after result j), after
  which result the branches went (share of each arm's branches), and do branches change outcomes
  (branch_outcome_differs after result j next to the fresh-sample yardstick global_pairs_differ), per
  arm (analysis/branches.py).

Each arm keeps one color in every panel (arm_colors).
"""

from __future__ import annotations

import statistics
from pathlib import Path

COLORS = {"arpo": "tab:red", "grpo": "tab:blue", "aepo": "tab:green"}  # the presets
MORE = ["tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray", "gold", "navy"]
HATCH = ["", "//", "xx", "..", "\\\\"]  # branch after result 1, 2, 3, ...


def arm_colors(arms: list[str]) -> dict[str, str]:
    """One distinct color per arm: a preset its own (COLORS), other arms (preset@rule, your presets)
    the next unused color of MORE, in order; past MORE's end, colors repeat."""
    out = {m: COLORS[m] for m in arms if m in COLORS}
    rest = [c for c in MORE if c not in out.values()]
    for k, m in enumerate(m for m in arms if m not in out):
        out[m] = rest[k % len(rest)]
    return out


def arm_label(m: str) -> str:
    """ARPO, ARPO@zscore: the preset in capitals, the rule as it is written."""
    preset, at, rule = m.partition("@")
    return preset.upper() + at + rule


def curve_stats(rs: list[dict]) -> dict[str, list[float]]:
    """Per eval point over seeds: step, mean accuracy, sample sd (0 for one seed), mean tool calls."""
    n = min(len(r["curve"]) for r in rs)
    pts = [[r["curve"][i] for r in rs] for i in range(n)]
    return {"step": [p[0]["step"] for p in pts],
            "mean": [statistics.fmean(q["accuracy"] for q in p) for p in pts],
            "sd": [statistics.stdev(q["accuracy"] for q in p) if len(p) > 1 else 0.0 for p in pts],
            "tool_calls": [statistics.fmean(q["tool_calls"] for q in p) for p in pts]}


def plot(results: dict, out: Path) -> list[Path]:
    """Both figures (module docstring) into `out`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    paths = [accuracy_figure(results, out / "hop2_accuracy.png")]
    if results.get("branching"):
        paths.append(branching_figure(results["branching"], out / "hop2_branching.png"))
    return paths


def accuracy_figure(results: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt

    runs = results["runs"]
    colors = arm_colors(list(runs))
    budgets = [lv["calls"] for lv in (results.get("matched_calls") or {}).get("levels", [])]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    for ax, xkey, xlabel in ((axes[0], "step", "RL step"),
                             (axes[1], "tool_calls", "tool calls executed in training rollouts (cumulative)")):
        for m, rs in runs.items():
            c = curve_stats(rs)
            for r in rs:
                ax.plot([p[xkey] for p in r["curve"]], [p["accuracy"] for p in r["curve"]], color=colors[m],
                        alpha=0.25, lw=0.8)
            xs = c[xkey]
            ax.plot(xs, c["mean"], color=colors[m], lw=2, marker="o", ms=3,
                    label=f"{arm_label(m)} ({len(rs)} seed{'s' if len(rs) > 1 else ''})")
            ax.fill_between(xs, [a - s for a, s in zip(c["mean"], c["sd"], strict=True)],
                            [a + s for a, s in zip(c["mean"], c["sd"], strict=True)], color=colors[m], alpha=0.12)
        ax.axhline(results["start_dev"]["accuracy"], color="gray", ls=":", lw=1, label="SFT start")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    for c in budgets:
        axes[1].axvline(c, color="black", ls=":", lw=0.8, alpha=0.6)
    if budgets:
        axes[1].set_title("dotted: the matched budgets C = f · C_max", fontsize=9)
    axes[0].set_ylabel(f"dev accuracy (greedy, {results['settings']['eval_data']})")
    axes[0].set_title("thick: seed mean, band: ±1 sd over seeds, thin: each seed", fontsize=9)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 * ((len(labels) + 3) // 4), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def branching_figure(br: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    arms = list(br)
    colors = arm_colors(arms)
    pooled = {m: br[m]["pooled"] for m in arms}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    w = 0.8 / max(1, len(arms))
    for k, m in enumerate(arms):
        e = pooled[m]["entropy_after_results"]
        js = sorted(e, key=int)
        axes[0].bar([int(j) + (k - (len(arms) - 1) / 2) * w for j in js], [e[j]["share_rising"] for j in js],
                    w, color=colors[m], label=arm_label(m))
    axes[0].set_xticks(sorted({int(j) for m in arms for j in pooled[m]["entropy_after_results"]}))
    axes[0].axhline(0.5, color="gray", ls=":", lw=1)
    axes[0].set_xlabel("tool result")
    axes[0].set_ylabel("share of global samples with ΔH > 0")
    axes[0].set_title("does entropy rise after tool results? (all training steps)", fontsize=9)
    axes[0].legend(fontsize=7, ncol=2, loc="upper right")

    shown = [m for m in arms if pooled[m]["branches"]]
    js = sorted({j for m in shown for j in pooled[m]["by_result"]}, key=int)
    ticks = [f"{arm_label(m).replace('@', chr(10) + '@')}\n{pooled[m]['branches']} br." for m in shown]
    for x, m in enumerate(shown):  # where the branches went: each arm's branches by the result they followed
        bottom = 0.0
        for i, j in enumerate(js):
            share = (pooled[m]["by_result"].get(j) or {}).get("branches", 0) / pooled[m]["branches"]
            axes[1].bar(x, share, 0.6, bottom=bottom, color=colors[m], hatch=HATCH[i % len(HATCH)],
                        edgecolor="white", alpha=0.9)
            if share >= 0.08:
                axes[1].text(x, bottom + share / 2, f"{share:.0%}", ha="center", va="center", fontsize=7)
            bottom += share
    axes[1].set_xticks(range(len(shown)), ticks, fontsize=7)
    axes[1].set_ylim(0, 1.22)  # headroom for the legend
    axes[1].set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    axes[1].set_ylabel("share of the arm's branches")
    axes[1].set_title("after which tool result did the branches go?", fontsize=9)

    bars = [[(pooled[m]["by_result"].get(j) or {}).get("branch_outcome_differs") for m in shown] for j in js]
    bars.append([pooled[m]["global_pairs_differ"] for m in shown])
    w = 0.8 / len(bars)
    for b, vals in enumerate(bars):
        fresh = b == len(bars) - 1
        for x, (m, v) in enumerate(zip(shown, vals, strict=True)):
            axes[2].bar(x + (b - (len(bars) - 1) / 2) * w, v or 0.0, w, color="lightgray" if fresh else colors[m],
                        hatch="" if fresh else HATCH[b % len(HATCH)], edgecolor="white")
    axes[2].set_xticks(range(len(shown)), ticks, fontsize=7)
    axes[2].set_ylabel("share with different correctness")
    axes[2].set_title("do branches change outcomes? (a branch vs its parent)", fontsize=9)
    axes[2].set_ylim(0, 1.3 * max([0.1] + [p.get_height() for p in axes[2].patches]))
    keys = [Patch(facecolor="darkgray", hatch=HATCH[i % len(HATCH)], edgecolor="white", label=f"after result {j}")
            for i, j in enumerate(js)]
    axes[1].legend(handles=keys, fontsize=7, loc="upper center", ncol=max(1, len(keys)))
    axes[2].legend(handles=[*keys, Patch(facecolor="lightgray", label="two fresh samples")], fontsize=7,
                   loc="upper right", ncol=2)
    for ax in axes:
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
