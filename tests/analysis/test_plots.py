"""`arpo plot`'s panels (analysis/curves.py) (issue 42 item 8: what a newcomer's first tries found; each
test failed before its fix)."""

from __future__ import annotations


def test_run_plots_have_whole_step_ticks_and_every_tool_in_the_legend():
    """`arpo plot` drew fractional step ticks (0.5, 1.5) and left plug-in tools' call curves out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from arpo.analysis.curves import draw_panel, panel_keys

    rows = [{"step": s, "reward_mean": 0.1 * s, "tool_calls_per_traj": 1.0, "tool_calls_per_traj/lookup": 1.0,
             "tool_calls_per_traj/python": 0.5} for s in (1, 2, 3)]
    keys = panel_keys(rows)
    assert keys["tool_calls"] == ["tool_calls_per_traj", "tool_calls_per_traj/python", "tool_calls_per_traj/lookup"]
    fig = draw_panel(rows, "tool_calls", keys["tool_calls"])
    ax = fig.axes[0]
    fig.canvas.draw()
    lo, hi = ax.get_xlim()
    ticks = [x for x in ax.get_xticks() if lo <= x <= hi]
    assert ticks and all(float(x).is_integer() for x in ticks), ticks
    assert [t.get_text() for t in ax.get_legend().get_texts()] == keys["tool_calls"]
    plt.close(fig)
