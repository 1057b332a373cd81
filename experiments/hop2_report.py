"""The result tables of docs/experiment_hop2.md, rendered from a hop2 results.json (its `statistics`
section: hop2_stats.py). `arpo experiment hop2-stats` prints them and the experiment writes them to
OUT/report.md; tests/experiments/test_hop2_doc.py checks that the doc quotes them verbatim."""

from __future__ import annotations

UP = {"arpo": "ARPO", "aepo": "AEPO", "grpo": "GRPO"}


def _up(m: str) -> str:
    return UP.get(m, m.upper())


def _f(x: float | None, d: int = 3, sign: bool = False) -> str:
    if x is None:
        return "–"
    return f"{x:+.{d}f}" if sign else f"{x:.{d}f}"


def _ci(c: dict | None, d: int = 3, sign: bool = False) -> str:
    return "–" if not c else f"[{_f(c['ci_low'], d, sign)}, {_f(c['ci_high'], d, sign)}]"


def _range(xs: list[float] | None, d: int = 3, sign: bool = False) -> str:
    """[min, max] of one value per seed: with 3–5 runs that, not a 95 % interval, is what is known."""
    return "–" if not xs else f"[{_f(min(xs), d, sign)}, {_f(max(xs), d, sign)}]"


def _p(p: float) -> str:
    """Two significant digits below 0.1 (0.043, 0.0015), else two decimals (0.60)."""
    return f"{p:.2g}" if p < 0.1 else f"{p:.2f}"


def runs_table(results: dict) -> str:
    """Per run: dev accuracy at each evaluation, cumulative training tool calls, branches, the RL
    steps' summed time, and the paired comparison of the final checkpoint with the SFT start."""
    first = next(iter(results["runs"].values()))[0]
    steps = [p["step"] for p in first["curve"]]
    head = ("| method | seed | " + " | ".join(f"dev @{s}" for s in steps) + " | tool calls " +
            " / ".join(f"@{s}" for s in steps[1:]) + " | branches | RL steps (s) | vs SFT: solves / fails |")
    lines = [head, "|" + "---|" * (len(steps) + 6)]
    for m, rs in results["runs"].items():
        for r in rs:
            fv = r["final_vs_sft"]
            lines.append(f"| {_up(m)} | {r['seed']} | " + " | ".join(_f(p["accuracy"]) for p in r["curve"])
                         + " | " + " / ".join(str(p["tool_calls"]) for p in r["curve"][1:])
                         + f" | {r['branches_total']} | {sum(p.get('step_seconds', 0) for p in r['per_step']):.0f}"
                         + f" | +{fv['wins']} / −{fv['losses']}{' *' if fv['significant'] else ''} |")
    return "\n".join(lines)


def accuracy_table(results: dict, split: str) -> str:
    """Per method at the selected step: per seed, mean ± sample sd, the range over seeds (min, max: 3–5
    runs are too few for a 95 % interval), the crossed bootstrap over seeds and clusters where
    computable, the question bootstrap as the protocol reported it."""
    st, raw = results["statistics"][split], results[split]
    lines = ["| method | per seed | mean ± sd | range over seeds | bootstrap over seeds and clusters | "
             "95 % over questions (as reported) | tool calls / question |", "|---|---|---|---|---|---|---|"]
    for m in results["statistics"]["methods"]:
        a = st[m]
        lines.append(f"| {_up(m)} | {', '.join(_f(x) for x in a['accuracy_per_seed'])} | "
                     f"{_f(a['accuracy_mean'])} ± {_f(raw[m]['accuracy_sd'])} | {_range(a['accuracy_per_seed'])} | "
                     f"{_ci(a['crossed_bootstrap']) if a['crossed_bootstrap'] else 'n/a'} | "
                     f"{_ci(a['question_bootstrap_as_reported'])} | {_f(raw[m]['tool_calls_per_question'], 2)} |")
    return "\n".join(lines)


def comparison_table(results: dict, split: str) -> str:
    """Each method vs the base: the difference of means, per seed, the seed-level tests, the range of
    the per-seed differences, the cluster-aware ones where computable, and the per-question sign test
    as reported."""
    s = results["statistics"]
    lines = ["| vs " + _up(s["base"]) + " | Δ mean | Δ per seed | permutation p (seeds) | sign-flip p (seeds) | "
             "range over seeds | bootstrap over seeds and clusters | clusters: wins / losses / ties (p) | "
             "questions as independent: wins / losses / ties (p) |", "|---|---|---|---|---|---|---|---|---|"]
    for m in s["methods"][:-1]:
        c = s[split][f"{m}_vs_{s['base']}"]
        sl, q, cl = c["seed_level"], c["question_paired_as_reported"], c["cluster_paired"]
        lines.append(f"| {_up(m)} | {_f(sl['diff'], sign=True)} | "
                     f"{', '.join(_f(x, sign=True) for x in sl['per_seed_diff'])} | {_p(sl['p_permutation'])} | "
                     f"{_p(sl['p_sign_flip'])} | {_range(sl.get('per_seed_diff'), sign=True)} | "
                     f"{_ci(c['crossed_bootstrap_diff'], sign=True) if c['crossed_bootstrap_diff'] else 'n/a'} | "
                     + (f"{cl['wins']} / {cl['losses']} / {cl['ties']} ({_p(cl['p_sign_test'])})" if cl else "n/a")
                     + f" | {q['wins']} / {q['losses']} / {q['ties']} ({_p(q['p_sign_test'])}) |")
    return "\n".join(lines)


def tool_calls_table(results: dict) -> str:
    """Training tool calls issued over all steps and seeds, their ratio with both intervals, per seed."""
    s, runs = results["statistics"], results["runs"]
    total = {m: sum(p.get("tool_calls_issued", 0) for r in rs for p in r["per_step"]) for m, rs in runs.items()}
    lines = ["| ratio | calls issued | bootstrap over seed pairs, then steps | 95 % over steps (as reported) | "
             "per seed pair | sign-flip p (seeds) |", "|---|---|---|---|---|---|"]
    for k, v in s["tool_calls"].items():
        a, b = k.split("/")
        lines.append(f"| {_up(a)} / {_up(b)} **{_f(v['two_stage']['ratio'] if v['two_stage'] else None, 2)}** | "
                     f"{total[a]} / {total[b]} | {_ci(v['two_stage'], 2)} | {_ci(v['steps_only_as_reported'], 2)} | "
                     f"{', '.join(_f(x, 2) for x in v['per_seed'])} | "
                     f"{_p(v['p_sign_flip_log_ratio']) if v['p_sign_flip_log_ratio'] is not None else '–'} |")
    return "\n".join(lines)


def calls_to_accuracy_table(results: dict) -> str:
    """Per comparison: calls to reach 25 / 50 / 75 / 100 % of the way from the SFT start to the
    highest seed-mean dev accuracy both arms reach, the ratio, and the per-seed-pair ratios."""
    s = results["statistics"]
    lines = ["| ratio | per step (all calls) | target accuracy | at 25 % | at 50 % | at 75 % | at 100 % | "
             "per seed pair (at its own target) |", "|---|---|---|---|---|---|---|---|"]
    for k, v in s["calls_to_accuracy"].items():
        a, b = k.split("/")
        lv = [f"{_f(x['ratio'], 2)} ({_f(x['accuracy'])}: {_f(x['calls_' + a], 0)} vs {_f(x['calls_' + b], 0)})"
              if x["ratio"] is not None else "–" for x in v["levels"]]
        per = ", ".join(_f(p["ratio"], 2) for p in v["per_seed_pair"])
        lines.append(f"| {_up(a)} / {_up(b)} | {_f(v['per_step_ratio'], 2)} | {_f(v['target_accuracy'])} | "
                     + " | ".join(lv) + f" | {per} |")
    return "\n".join(lines)


def branching_table(results: dict) -> str:
    """Per arm, pooled over seeds and training steps (analysis/branches.py): branches of the branch
    decisions, after which tool result t they went (count, share of the arm's branches), the share
    of branches whose correctness differs from their parent's after result t and over all, next to two
    fresh samples' rate (the same prompt's global samples), and the share of global samples whose
    entropy rose (ΔH > 0) after result t."""
    arms = {m: b["pooled"] for m, b in results.get("branching", {}).items()}
    ts = sorted({t for p in arms.values() for t in (*p["by_result"], *p["entropy_after_results"])}, key=int)
    lines = ["| method | branches / decisions (rate) | " + " | ".join(f"after result {t}: branches (share), "
             "outcome differs" for t in ts) + " | outcome differs, all branches | two fresh samples differ | "
             + " | ".join(f"ΔH > 0 after result {t}" for t in ts) + " |", "|---|---|" + "---|" * (2 * len(ts) + 2)]
    for m, p in arms.items():
        n = p["branches"]
        after = [(p["by_result"].get(t) or {}) for t in ts]
        lines.append(f"| {_up(m)} | {n} / {p['branch_decisions']} ({_f(p['branch_rate'], 2)}) | "
                     + " | ".join(f"{a['branches']} ({a['branches'] / n:.0%}), {_f(a['branch_outcome_differs'], 2)}"
                                  if a else "–" for a in after)
                     + f" | {_f(p['branch_outcome_differs'], 2)} | {_f(p['global_pairs_differ'], 2)} | "
                     + " | ".join(_f((p["entropy_after_results"].get(t) or {}).get("share_rising"), 2) for t in ts)
                     + " |")
    return "\n".join(lines)


def report(results: dict) -> str:
    """Every table above, each under a heading line, as markdown."""
    parts = [("Per run", runs_table(results))]
    for split in ("dev", "test"):
        if split in results["statistics"]:
            parts += [(f"Accuracy, {split}", accuracy_table(results, split)),
                      (f"Comparisons, {split}", comparison_table(results, split))]
    parts += [("Training tool calls", tool_calls_table(results)),
              ("Calls to reach an accuracy", calls_to_accuracy_table(results))]
    if results.get("branching"):
        parts.append(("Branches (training rollouts, pooled over seeds and steps)", branching_table(results)))
    return "\n\n".join(f"{h}:\n\n{t}" for h, t in parts) + "\n"
