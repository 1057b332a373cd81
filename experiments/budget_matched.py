"""Accuracy at equal executed tool calls (issue 41; docs/branch_rules.md "The comparison").

Each arm spends a different number of executed tool calls per step (prefix sharing,
AEPO's probe), so next to "accuracy at the dev-selected step" the results hold `matched_calls`:
each run's dev accuracy at the same cumulative executed training calls C, linearly interpolated
between its evaluations (accuracy_at), for C = f·C_max, C_max = the calls every run reached (the
smallest final cumulative count over all runs, so nothing is extrapolated), f in budget_fractions;
per C the seed-level tests against the base (clustered.seed_level) and a seed bootstrap. Training is
not cut short at C: every arm trains the same steps, and the comparison reads the curves at C.
One run that stops calling tools sets C_max for all (a collapse: then every curve is read early), so
`matched_calls_per_pair` also reads each arm against the base seed pair by seed pair, at the pair's
own largest common budget (pair_matched_calls; added after the hop2 study's first seeds showed it).
"""

from __future__ import annotations

import statistics
from typing import Any

from experiments import clustered as C
from experiments.hop2_report import _ci, _f, _p


def accuracy_at(curve: list[dict], calls: float) -> float:
    """Accuracy at `calls` cumulative executed training calls on a run's curve [(c_0, a_0), ...] (c
    non-decreasing): a_i + (a_{i+1} − a_i)·(calls − c_i)/(c_{i+1} − c_i) for c_i ≤ calls ≤ c_{i+1}
    (the first such segment; a flat stretch c_i = c_{i+1} = calls gives a_i). Outside [c_0, c_last]: an error."""
    pts = [(float(p["tool_calls"]), float(p["accuracy"])) for p in curve]
    for (c0, a0), (c1, a1) in zip(pts, pts[1:], strict=False):
        if c0 <= calls <= c1:
            return a0 if c1 == c0 else a0 + (a1 - a0) * (calls - c0) / (c1 - c0)
    if pts and calls == pts[0][0]:
        return pts[0][1]
    raise ValueError(f"{calls} calls lie outside the curve's [{pts[0][0]}, {pts[-1][0]}]")


def matched_calls(runs: dict[str, list[dict]], fractions: list[float], opts: dict) -> dict:
    """Per budget C = f·C_max (module docstring): each run's accuracy at C, the arm's mean and seed
    bootstrap, and each arm against the base (the last) with clustered.seed_level."""
    methods = list(runs)
    base = methods[-1]
    c_max = min(float(r["curve"][-1]["tool_calls"]) for rs in runs.values() for r in rs)
    out: dict[str, Any] = {"c_max": c_max, "base": base, "levels": [],
                           "how": "each run's dev curve against cumulative executed training tool calls, linearly "
                                  "interpolated at C = f·c_max; c_max = the smallest final count over all runs"}
    for f in fractions:
        c = f * c_max
        accs = {m: [accuracy_at(r["curve"], c) for r in rs] for m, rs in runs.items()}
        out["levels"].append({
            "fraction": f, "calls": c,
            "arms": {m: {"accuracy_per_seed": a, "accuracy_mean": statistics.fmean(a),
                         "seed_bootstrap": {**C.crossed_bootstrap_mean([[x] for x in a], ["all"], **opts),
                                            "resampled": "seeds only (each run's interpolated accuracy)"}}
                     for m, a in accs.items()},
            "vs_base": {f"{m}_vs_{base}": C.seed_level(accs[m], accs[base]) for m in methods if m != base}})
    return out


def matched_calls_table(mc: dict) -> str:
    """Markdown: per budget C, each arm's mean dev accuracy at C (seed bootstrap) and, against the base,
    the mean difference with the sign-flip p over seeds (the permutation p where seeds are unpaired)."""
    arms = list(mc["levels"][0]["arms"]) if mc["levels"] else []
    lines = ["| calls (f · C_max) | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for lv in mc["levels"]:
        cells = []
        for m in arms:
            a, vs = lv["arms"][m], lv["vs_base"].get(f"{m}_vs_{mc['base']}")
            cell = f"{_f(a['accuracy_mean'])} {_ci(a['seed_bootstrap'])}"
            if vs:
                cell += f"; Δ {_f(vs['diff'], sign=True)}, p {_p(vs.get('p_sign_flip', vs['p_permutation']))}"
            cells.append(cell)
        lines.append(f"| {_f(lv['calls'], 0)} ({lv['fraction']:g}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pair_matched_calls(runs: dict[str, list[dict]], opts: dict) -> dict:
    """Each arm against the base (the last), seed pair by seed pair (run s of each trains on the same
    prompts): both runs' dev accuracy at C_s = min(final calls of the two), the largest budget both
    reached, so nothing is extrapolated and a run that stopped calling tools caps its own pair only
    (matched_calls' single C_max is the smallest final count of all runs). Per arm: the C_s, each
    run's accuracy at C_s, the differences d_s = a_s − b_s with clustered.seed_level's tests and their
    seed bootstrap."""
    methods = list(runs)
    base = methods[-1]
    out: dict[str, Any] = {"base": base, "arms": {},
                           "how": "per seed pair s: both runs' dev curves (linear in cumulative executed training "
                                  "tool calls) read at C_s = the smaller of the two final counts"}
    for m in methods[:-1]:
        calls = [min(float(a["curve"][-1]["tool_calls"]), float(b["curve"][-1]["tool_calls"]))
                 for a, b in zip(runs[m], runs[base], strict=True)]
        acc = [accuracy_at(r["curve"], c) for r, c in zip(runs[m], calls, strict=True)]
        acc_base = [accuracy_at(r["curve"], c) for r, c in zip(runs[base], calls, strict=True)]
        diffs = [a - b for a, b in zip(acc, acc_base, strict=True)]
        out["arms"][m] = {"calls_per_seed": calls, "accuracy_per_seed": acc, "base_accuracy_per_seed": acc_base,
                          "vs_base": C.seed_level(acc, acc_base),
                          "diff_seed_bootstrap": {**C.crossed_bootstrap_mean([[d] for d in diffs], ["all"], **opts),
                                                  "resampled": "seed pairs (each pair's difference)"}}
    return out


def pair_matched_calls_table(pm: dict) -> str:
    """Markdown: per arm, each seed pair's budget C_s and the two accuracies at it, the mean difference
    with its seed bootstrap and the sign-flip p over seed pairs."""
    lines = [f"| arm vs {pm['base']} | per seed pair: C_s, arm vs base | Δ mean | bootstrap over seed pairs | "
             "wins / losses | sign-flip p (seeds) |", "|---|---|---|---|---|---|"]
    for m, a in pm["arms"].items():
        vs = a["vs_base"]
        per = "; ".join(f"{c:.0f}: {_f(x)} vs {_f(y)}" for c, x, y in
                        zip(a["calls_per_seed"], a["accuracy_per_seed"], a["base_accuracy_per_seed"], strict=True))
        lines.append(f"| {m} | {per} | {_f(vs['diff'], sign=True)} | {_ci(a['diff_seed_bootstrap'], sign=True)} | "
                     f"{vs['wins']} / {vs['losses']} | {_p(vs['p_sign_flip'])} |")
    return "\n".join(lines)


def matched_report(res: dict) -> str:
    """Both matched-calls tables under their headings, as OUT/report.md ends and hop2-stats prints them."""
    return ("\nAccuracy at matched executed tool calls (dev; seeds only):\n\n"
            + matched_calls_table(res["matched_calls"])
            + "\n\nAccuracy at each seed pair's matched executed tool calls (dev):\n\n"
            + pair_matched_calls_table(res["matched_calls_per_pair"]) + "\n")
