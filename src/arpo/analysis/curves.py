"""Figures of a run's metrics.jsonl: one PNG per panel group, x = step."""

from __future__ import annotations

from pathlib import Path

from arpo.errors import ArpoError

PANELS = {
    "reward": ["reward_mean", "val/reward", "val/score"],
    "accuracy": ["accuracy", "val/pass@1", "format_error_rate", "tool_format_rate", "val/tool_format_rate"],
    "tool_calls": ["tool_calls_per_traj", "tool_calls_per_traj/python", "tool_calls_per_traj/search", "tool_failures"],
    "tool_calls_issued": ["tool_calls_issued"],
    "entropy": ["initial_entropy", "post_tool_entropy", "entropy"],
    "branches": ["branches", "trajectories", "branch_decisions"],
    "branch_rate": ["branch_rate", "delta_entropy"],
    "loss": ["loss", "pg_loss", "nll", "clip_frac", "approx_kl", "grad_norm"],
    "speed": ["tokens_per_s", "time_generation", "time_training", "step_seconds"],
    # training/health.py: groups without gradient, and the distribution of tool calls per trajectory
    "health": ["constant_groups"],
}
WARN = "warn/"  # training/health.py marks a step on which a rule fired: warn/<name> = 1


def warnings_by_step(rows: list[dict]) -> dict[int, list[str]]:
    """{step: the names of the collapse warnings (training/health.py) that fired at that step}."""
    out = {r["step"]: sorted(k[len(WARN):] for k in r if k.startswith(WARN)) for r in rows if "step" in r}
    return {s: names for s, names in out.items() if names}


def panel_keys(rows: list[dict]) -> dict[str, list[str]]:
    """The metrics each panel draws: its listed keys that the rows hold, plus every tool's own calls
    per trajectory (`tool_calls_per_traj/<tool>`: plug-in, MCP and web tools too, not only python and
    search, whose curves were missing from the legend)."""
    numeric = {k for r in rows for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    out = {}
    for name, keys in PANELS.items():
        present = [k for k in keys if k in numeric]
        if name == "tool_calls":
            present += sorted(k for k in numeric if k.startswith("tool_calls_per_traj/") and k not in present)
        if name == "health":  # calls_frac/k: the share of trajectories that made k tool calls
            present += sorted((k for k in numeric if k.startswith("calls_frac/")), key=lambda k: int(k.split("/")[1]))
        if present:
            out[name] = present
    return out


def draw_panel(rows: list[dict], name: str, keys: list[str]):
    """One panel's figure: a line per key against the step, whole-number step ticks."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for k in keys:
        pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
        ax.plot(*zip(*pts, strict=True), marker="o" if len(pts) < 30 else None, label=k)
    for i, (step, names) in enumerate(sorted(warnings_by_step(rows).items())):  # where the run said it collapses
        ax.axvline(step, color="red", alpha=0.3, linestyle="--", label="collapse warning" if i == 0 else None)
        ax.annotate(",".join(names), (step, 1), xycoords=("data", "axes fraction"), rotation=90, fontsize=6,
                    color="red", va="top", ha="right")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers (2.5 was a tick)
    ax.set_xlabel("step")
    ax.set_title(name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_run(rows: list[dict], out_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        raise ArpoError("no metrics to plot (metrics.jsonl is empty or missing)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, keys in panel_keys(rows).items():
        fig = draw_panel(rows, name, keys)
        p = out_dir / f"{name}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    return written
