"""Where did the branches go, and did they matter? Measured on the trees a training run kept
(RUN_DIR/rollouts/step_N.jsonl.gz, format `arpo-rollouts/1`; training/rollout_log.py's read_run_trees).

ARPO branches after a tool result when the entropy rose there. Two questions decide whether that
pays on a task:

1. **Does entropy rise after tool results?** For every global sample g (parent null) and each of its
   tool results j: ΔH_{g,j} = H_{g,j} − H_{g,initial}, where H_{g,initial} is the mean entropy of
   the first k generated tokens and H_{g,j} that of the k tokens after result j (the values the
   branch rule used; `step_entropies` and `initial_entropy` of the record). Reported per result index
   j: the mean ΔH and the share of ΔH > 0.
2. **Do branches change outcomes?** For every branch b with parent p:
   differs(b) = [correct(b) ≠ correct(p)]. `branch_outcome_differs` = mean differs(b). Its yardstick
   is what two *fresh* samples of the same prompt give: over every tree and every unordered pair
   {g, h} of its global samples, `global_pairs_differ` = mean [correct(g) ≠ correct(h)]. `by_result`
   splits the branches by their point: after tool result j = the number of the branch's (inherited)
   tool calls whose result ends at or before its branch token `branch_at`. A branch
   that re-samples an already decided continuation gives 0; one taken where the outcome is still
   open approaches the fresh-sample rate.

Also: the branch rate (branched decisions / decisions), and the share of trees with mixed
correctness (the only ones with a gradient under group-normalized advantages).
"""

from __future__ import annotations

import itertools
import statistics


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def entropy_after_results(trees: list[dict]) -> dict[str, dict]:
    """Per tool-result index j (1-based, as a string): n, mean ΔH_{g,j} and the share of ΔH_{g,j} > 0
    over global samples g (formula 1 of the module docstring)."""
    by: dict[int, list[float]] = {}
    for tree in trees:
        for t in tree["trajectories"]:
            h0 = t.get("initial_entropy")
            if t.get("parent") is not None or h0 is None:
                continue
            for j, h in enumerate(t.get("step_entropies") or [], start=1):
                if h is not None:
                    by.setdefault(j, []).append(h - h0)
    return {str(j): {"n": len(v), "delta_entropy_mean": statistics.fmean(v),
                     "share_rising": statistics.fmean(float(d > 0) for d in v)} for j, v in sorted(by.items())}


def branch_outcomes(trees: list[dict]) -> dict:
    """Branches against fresh samples (formula 2 of the module docstring), the branch rate and the
    share of mixed trees."""
    differs: list[float] = []
    by_result: dict[int, list[float]] = {}  # the branch's point: after tool result j
    fresh: list[float] = []
    decisions = branched = mixed = 0
    for tree in trees:
        ts = {t["id"]: t for t in tree["trajectories"]}
        mixed += len({bool(t["correct"]) for t in ts.values()}) > 1
        for t in ts.values():
            for d in t.get("decisions") or []:
                decisions += 1
                branched += bool(d.get("branched"))
            if t.get("parent") is not None:
                differs.append(float(bool(t["correct"]) != bool(ts[t["parent"]]["correct"])))
                j = sum(c["result_span"][1] <= t["branch_at"] for c in t.get("tool_calls") or [])
                by_result.setdefault(j, []).append(differs[-1])
        roots = [bool(t["correct"]) for t in ts.values() if t.get("parent") is None]
        fresh += [float(a != b) for a, b in itertools.combinations(roots, 2)]
    return {"trees": len(trees), "branches": len(differs), "branch_decisions": decisions,
            "branch_rate": branched / decisions if decisions else None,
            "branch_outcome_differs": _mean(differs), "global_pairs_differ": _mean(fresh),
            "by_result": {str(j): {"branches": len(v), "branch_outcome_differs": statistics.fmean(v)}
                          for j, v in sorted(by_result.items())},
            "mixed_trees": mixed / len(trees) if trees else None}


def study(trees: list[dict]) -> dict:
    """Both questions on one set of trees."""
    return {"entropy_after_results": entropy_after_results(trees), **branch_outcomes(trees)}
