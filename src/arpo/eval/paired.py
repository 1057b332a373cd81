"""Statistics of eval files: accuracy with a 95 % interval, and the paired comparison of two models
on the same questions (which questions the second newly solves, which it newly fails).

* Accuracy interval: the Wilson score interval (Wilson 1927) over questions, with a question's
  correctness = its mean over samples (with one sample, 0 or 1; with several, the interval treats the
  n questions as n Bernoulli trials of the per-question pass@1, a slight under-statement of the
  spread). Wilson, not the normal approximation, because it stays inside [0, 1] and is honest at
  accuracies near 0 — where an untrained model sits.
* Paired wins/losses (McNemar's discordant pairs): over the questions both files answered, a *win*
  is a question the second model solves and the first does not (per-question pass@1 higher), a
  *loss* the reverse. Under "no difference" wins and losses are equally likely, so the change is
  larger than the paired noise when  wins − losses > 2·√(wins + losses)  (≈ a two-sided 95 % sign
  test); the exact two-sided sign-test p-value is reported too.
"""

from __future__ import annotations

import math
import statistics

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion successes/n (successes may be fractional: a sum of
    per-question pass@1 values). n = 0 gives (0, 1)."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n, got {successes} of {n}")
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def per_question(records: list[dict]) -> dict[str, float]:
    """example_id -> that question's pass@1 (mean correctness over its samples)."""
    by: dict[str, list[float]] = {}
    for r in records:
        by.setdefault(str(r["example_id"]), []).append(float(bool(r["correct"])))
    return {k: statistics.fmean(v) for k, v in by.items()}


def accuracy_interval(records: list[dict]) -> dict:
    """{questions, accuracy, ci_low, ci_high, ci: "wilson95"} of one dataset's records."""
    q = per_question(records)
    n, s = len(q), sum(q.values())
    lo, hi = wilson_interval(s, n)
    return {"questions": n, "accuracy": s / n if n else 0.0, "ci_low": lo, "ci_high": hi, "ci": "wilson95"}


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided sign-test p-value of wins vs losses (ties excluded): 1.0 when both are 0."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(records_a: list[dict], records_b: list[dict]) -> dict:
    """Paired comparison of model B against model A over the questions both answered.

    Returns {common, only_a, only_b, wins, losses, ties_solved, ties_unsolved, net, noise (2·√(wins +
    losses)), significant (net > noise, or net < −noise for a significant drop), p_sign, win_ids,
    loss_ids}."""
    qa, qb = per_question(records_a), per_question(records_b)
    common = [k for k in qa if k in qb]
    wins = [k for k in common if qb[k] > qa[k]]
    losses = [k for k in common if qb[k] < qa[k]]
    same = [k for k in common if qb[k] == qa[k]]
    w, lo = len(wins), len(losses)
    noise = 2 * math.sqrt(w + lo)
    return {"common": len(common), "only_a": len(qa) - len(common), "only_b": len(qb) - len(common),
            "wins": w, "losses": lo, "ties_solved": sum(qa[k] > 0 for k in same),
            "ties_unsolved": sum(qa[k] == 0 for k in same), "net": w - lo, "noise": noise,
            "significant": abs(w - lo) > noise, "p_sign": sign_test_p(w, lo), "win_ids": wins, "loss_ids": losses}


def compare_runs(runs: dict[str, dict]) -> dict:
    """runs: label -> an `arpo eval --out` JSON object (with its per-sample `records`).

    Returns {"intervals": [{dataset, label, questions, accuracy, ci_low, ci_high, ci}],
    "paired": [{dataset, a, b, **paired(a, b)}]}: an accuracy interval per (dataset, label) and the
    paired comparison of each label with the one before it (base → sft → arpo: what each stage
    changed), on every dataset both have records for. Files without records are skipped."""
    intervals, pairs = [], []
    labels = list(runs)
    for label in labels:
        for ds, recs in (runs[label].get("records") or {}).items():
            if recs:
                intervals.append({"dataset": ds, "label": label, **accuracy_interval(recs)})
    for a, b in zip(labels, labels[1:], strict=False):  # consecutive pairs: one fewer than labels
        ra, rb = runs[a].get("records") or {}, runs[b].get("records") or {}
        for ds in ra:
            if ra[ds] and rb.get(ds):
                pairs.append({"dataset": ds, "a": a, "b": b, **paired(ra[ds], rb[ds])})
    return {"intervals": intervals, "paired": pairs}
