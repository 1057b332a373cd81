"""The paper's Figure 1 observation, measured: token entropy by position right after each tool
result, against the entropy at the start of the response.

A response is a sequence of generated segments separated by tool results (loss mask 0). Segment 0
starts the response; segment j >= 1 follows the j-th tool result. For every offset d we average the
per-token entropy at position d of segment 0 ("initial") and of segments j >= 1 ("after tool
result j"). ARPO's premise is that the post-tool curve starts above the initial one.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from arpo.errors import ArpoError
from arpo.jsonl import iter_jsonl


def segments(loss_mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of generated tokens (mask 1), in order."""
    out, start = [], None
    for i, m in enumerate(loss_mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(loss_mask)))
    return out


def read_dump(path: str | Path) -> list[dict]:
    """The trajectories of an `arpo rollout` dump, or of a training run's saved trees
    (RUN_DIR/rollouts/step_N.jsonl.gz, format arpo-rollouts/1: a tree per line; it was refused)."""
    rows = []
    for where, r in iter_jsonl(path, "rollout dump"):
        if isinstance(r.get("trajectories"), list) and str(r.get("format", "")).startswith("arpo-rollouts/"):
            # a trajectory stores its own tokens from its branch point: a global one (parent None) all of them
            rows += [{"entropies": t.get("entropy") or [], "loss_mask": t.get("mask") or [],
                      "parent_id": t.get("parent")} for t in r["trajectories"]]
            continue
        for k in ("entropies", "loss_mask"):
            if not isinstance(r.get(k), list):
                raise ArpoError(f"{where}: field {k!r} missing (is this an `arpo rollout` dump?)")
        rows.append(r)
    return rows


def entropy_by_position(records: list[dict], window: int = 50, skip_branches: bool = True) -> dict:
    """Mean entropy at each offset of segment 0 and of post-tool segments (overall and per call index).
    Forks are skipped by default: their tokens before the branch point are their parent's."""
    init: list[list[float]] = [[] for _ in range(window)]
    post: list[list[float]] = [[] for _ in range(window)]
    per_call: dict[int, list[list[float]]] = {}
    n_traj = n_results = 0
    for r in records:
        if skip_branches and r.get("parent_id") is not None:
            continue
        n_traj += 1
        ents = r["entropies"]
        for j, (s, e) in enumerate(segments(r["loss_mask"])):
            if j > 0:
                n_results += 1
            for d in range(min(window, e - s)):
                (init if j == 0 else post)[d].append(ents[s + d])
                if j > 0:
                    per_call.setdefault(j, [[] for _ in range(window)])[d].append(ents[s + d])

    def mean_curve(bins):
        return [statistics.fmean(b) if b else None for b in bins]

    def head_mean(bins, k=20):
        vals = [x for b in bins[:k] for x in b]
        return statistics.fmean(vals) if vals else None

    return {
        "trajectories": n_traj, "tool_results": n_results, "window": window,
        "initial": mean_curve(init), "after_tool": mean_curve(post),
        "after_tool_by_call": {j: mean_curve(b) for j, b in sorted(per_call.items())},
        "initial_first20_mean": head_mean(init), "after_tool_first20_mean": head_mean(post),
        "counts_initial": [len(b) for b in init], "counts_after_tool": [len(b) for b in post],
    }


def plot_entropy(stats: dict, out_png: str | Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = list(range(stats["window"]))
    for name, curve, style in (("response start (initial)", stats["initial"], "-"),
                               ("after any tool result", stats["after_tool"], "-")):
        pts = [(x, y) for x, y in zip(xs, curve, strict=True) if y is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, label=name, linewidth=2)
    for j, curve in list(stats["after_tool_by_call"].items())[:3]:
        pts = [(x, y) for x, y in zip(xs, curve, strict=True) if y is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), ":", label=f"after tool result {j}")
    ax.set_xlabel("token position within the segment")
    ax.set_ylabel("token entropy (nats)")
    ax.set_title(title or f"entropy after tool results ({stats['trajectories']} trajectories, "
                 f"{stats['tool_results']} results)")
    ax.legend()
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
