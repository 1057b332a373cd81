"""Statistics that count every source of variation of a seeded experiment (issue 38): the RL seeds
and the question clusters. Pure functions, math in the docstrings; tests/experiments/test_clustered.py
checks them against hand-computed values.

The data of one arm is a table x[s][q]: the correctness (0/1, or a mean over samples) of question q
under RL seed s. Every seed answers every question, so seeds and questions are *crossed*. Questions
come in clusters (hop2: the three attributes asked of one (town, relation) share the first page, the
related town and the second page, everything but the last number read), and a cluster's questions
are not independent. A dataset declares its clusters with a `cluster` field per row
(data/datasets.py); a row without one is its own cluster.

    crossed_bootstrap_mean   the mean of x, resampling seeds and clusters independently (the
                             pigeonhole bootstrap of a crossed design, Owen 2007, Ann. Appl. Stat.)
    crossed_bootstrap_diff   the same for mean(x_a) − mean(x_b): clusters drawn once for both arms
                             (the same questions), seeds drawn per arm (run s of arm a is not run s of b)
    seed_permutation_p       exact two-sided permutation test over the runs' arm labels (seed level)
    sign_flip_p              exact two-sided sign-flip test of paired per-seed differences
    cluster_paired           wins / losses / ties per cluster and the exact sign test over clusters
    two_stage_ratio_ci       Σa/Σb over (seed, step) units: seed pairs, then steps within each seed

Each result carries `resampled` (intervals) or `unit` (tests): what it treats as the random, independent units.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

from experiments.blind_protocol import percentile_interval, sign_test_p

Table = Sequence[Sequence[float]]  # x[s][q]: seed s, question q


def cluster_sums(x: Table, clusters: Sequence[str]) -> tuple[list[list[float]], list[int], list[str]]:
    """(t, n, labels): t[s][k] = Σ_{q ∈ cluster k} x[s][q], n[k] = |cluster k|, clusters in order of
    first appearance."""
    labels = list(dict.fromkeys(clusters))
    pos = {c: k for k, c in enumerate(labels)}
    n = [0] * len(labels)
    for c in clusters:
        n[pos[c]] += 1
    t = [[0.0] * len(labels) for _ in x]
    for s, row in enumerate(x):
        if len(row) != len(clusters):
            raise ValueError(f"seed {s} has {len(row)} questions, the clusters name {len(clusters)}")
        for v, c in zip(row, clusters, strict=True):
            t[s][pos[c]] += float(v)
    return t, n, labels


def resampled_mean(t: list[list[float]], n: list[int], seeds: Sequence[int], ks: Sequence[int]) -> float:
    """The mean over the resampled cells, a ratio because clusters may differ in size:
    x̄* = Σ_{s ∈ S*} Σ_{k ∈ K*} t[s][k] / (|S*| · Σ_{k ∈ K*} n[k])  (draws counted with multiplicity)."""
    den = len(seeds) * sum(n[k] for k in ks)
    return sum(t[s][k] for s in seeds for k in ks) / den


def _draw(rng: random.Random, m: int) -> list[int]:
    return [rng.randrange(m) for _ in range(m)]


def crossed_bootstrap_mean(x: Table, clusters: Sequence[str], n_resamples: int = 2000, level: float = 0.95,
                           seed: int = 0) -> dict:
    """{mean, ci_low, ci_high, seeds, questions, clusters, resamples, ...} of x̄ = Σ_{s,q} x[s][q] / (S·Q).
    Each replicate draws S seeds and K clusters with replacement, independently (random.Random(seed)),
    and takes resampled_mean; the interval is percentile_interval of the replicates. With one seed it
    resamples clusters only; with every question its own cluster it is the question bootstrap."""
    t, n, labels = cluster_sums(x, clusters)
    rng = random.Random(seed)
    reps = [resampled_mean(t, n, _draw(rng, len(t)), _draw(rng, len(n))) for _ in range(n_resamples)]
    lo, hi = percentile_interval(reps, level)
    mean = resampled_mean(t, n, range(len(t)), range(len(n)))
    return {"mean": mean, "ci_low": lo, "ci_high": hi, "seeds": len(t), "questions": len(clusters),
            "clusters": len(labels), "resampled": "seeds and question clusters, independently (crossed)",
            "resamples": n_resamples, "level": level, "seed": seed}


def crossed_bootstrap_diff(xa: Table, xb: Table, clusters: Sequence[str], n_resamples: int = 2000,
                           level: float = 0.95, seed: int = 0) -> dict:
    """{diff, ci_low, ci_high, ...} of Δ = x̄_a − x̄_b over the same questions. A replicate draws K
    clusters once (both arms answered the same questions) and the seeds of each arm on their own
    (arm a's run s and arm b's run s share only the prompt order, so no pairing is assumed):
    Δ* = resampled_mean(a; S_a*, K*) − resampled_mean(b; S_b*, K*)."""
    ta, n, labels = cluster_sums(xa, clusters)
    tb, _, _ = cluster_sums(xb, clusters)
    rng = random.Random(seed)
    reps = []
    for _ in range(n_resamples):
        ks = _draw(rng, len(n))
        reps.append(resampled_mean(ta, n, _draw(rng, len(ta)), ks) - resampled_mean(tb, n, _draw(rng, len(tb)), ks))
    lo, hi = percentile_interval(reps, level)
    diff = resampled_mean(ta, n, range(len(ta)), range(len(n))) - resampled_mean(tb, n, range(len(tb)), range(len(n)))
    return {"diff": diff, "ci_low": lo, "ci_high": hi, "seeds": [len(ta), len(tb)], "questions": len(clusters),
            "clusters": len(labels), "resampled": "question clusters (shared by both arms) and each arm's seeds",
            "resamples": n_resamples, "level": level, "seed": seed}


def seed_permutation_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Exact two-sided permutation test of mean(a) = mean(b) over the runs' labels (one score per run,
    e.g. its accuracy): of the C(n_a + n_b, n_a) ways to call n_a of the pooled runs `a`, the share
    whose |mean(a*) − mean(b*)| ≥ |mean(a) − mean(b)| (the observed split counts). 3 vs 3 runs: 20
    splits, so the smallest possible p is 2/20 = 0.1."""
    pooled, na = [float(v) for v in (*a, *b)], len(a)
    if na == 0 or len(b) == 0:
        raise ValueError("both arms need at least one run")
    total = sum(pooled)
    obs = abs(sum(a) / na - sum(b) / len(b))
    hits = count = 0
    for idx in itertools.combinations(range(len(pooled)), na):
        sa = sum(pooled[i] for i in idx)
        hits += abs(sa / na - (total - sa) / len(b)) >= obs - 1e-12
        count += 1
    return hits / count


def sign_flip_p(d: Sequence[float]) -> float:
    """Exact two-sided sign-flip (paired permutation) test of mean(d) = 0 for paired differences d_s
    (arm a's seed s minus arm b's seed s): the share of the 2ⁿ sign vectors ε with |Σ ε_s d_s| ≥ |Σ d_s|.
    3 seeds: 8 vectors, so the smallest possible p is 2/8 = 0.25."""
    obs = abs(sum(d))
    flips = list(itertools.product((1, -1), repeat=len(d)))
    return sum(abs(sum(e * v for e, v in zip(f, d, strict=True))) >= obs - 1e-12 for f in flips) / len(flips)


def seed_level(a: Sequence[float], b: Sequence[float]) -> dict:
    """One score per run (e.g. its accuracy) of arms a and b, run s of each with RL seed s: the mean
    difference, the exact permutation test over labels (unpaired) and the exact sign-flip test (paired
    by seed). Questions are fixed: this counts the seed-to-seed variation only."""
    out: dict = {"diff": sum(a) / len(a) - sum(b) / len(b), "runs": [len(a), len(b)],
                 "p_permutation": seed_permutation_p(a, b), "unit": "seed (one accuracy per run)"}
    if len(a) == len(b):
        d = [x - y for x, y in zip(a, b, strict=True)]
        out.update(per_seed_diff=d, p_sign_flip=sign_flip_p(d), wins=sum(v > 0 for v in d),
                   losses=sum(v < 0 for v in d))
    return out


def cluster_paired(xa: Table, xb: Table, clusters: Sequence[str]) -> dict:
    """Per cluster k: D_k = (mean of x_a over its questions and the seeds) − (the same of x_b); wins =
    #{D_k > 0}, losses = #{D_k < 0}, ties the rest, p = sign_test_p(wins, losses): the per-question sign
    test with a cluster, not a question, as the independent unit."""
    ta, n, labels = cluster_sums(xa, clusters)
    tb, _, _ = cluster_sums(xb, clusters)
    d = [sum(r[k] for r in ta) / (len(ta) * n[k]) - sum(r[k] for r in tb) / (len(tb) * n[k]) for k in range(len(n))]
    w, lo = sum(v > 1e-12 for v in d), sum(v < -1e-12 for v in d)
    return {"wins": w, "losses": lo, "ties": len(d) - w - lo, "p_sign_test": sign_test_p(w, lo),
            "unit": "question cluster (mean over its questions and the seeds)", "clusters": len(labels)}


def two_stage_ratio_ci(a: Table, b: Table, n_resamples: int = 2000, level: float = 0.95, seed: int = 0) -> dict:
    """{ratio, ci_low, ci_high, ...} of R = Σ_{s,t} a[s][t] / Σ_{s,t} b[s][t] (e.g. tool calls of seed s at
    step t; step t of seed s trains on the same prompts in both arms, so (s, t) pairs the arms). A
    replicate draws S seeds with replacement, then for each drawn seed T steps with replacement, and
    uses the same draws for a and b: R* = Σ_{s ∈ S*} Σ_{t ∈ T*_s} a[s][t] / Σ ... b[s][t]. With one seed
    it is the step bootstrap of blind_protocol.bootstrap_ratio_ci."""
    if len(a) != len(b) or not a or any(len(r) != len(q) or not r for r, q in zip(a, b, strict=True)):
        raise ValueError("two_stage_ratio_ci needs the same seeds and steps in both arms")
    rng = random.Random(seed)
    reps = []
    for _ in range(n_resamples):
        num = den = 0.0
        for s in _draw(rng, len(a)):
            for t in _draw(rng, len(a[s])):
                num, den = num + a[s][t], den + b[s][t]
        if den == 0:
            raise ValueError("a resample has Σb = 0; the ratio is undefined")
        reps.append(num / den)
    lo, hi = percentile_interval(reps, level)
    return {"ratio": sum(map(sum, a)) / sum(map(sum, b)), "ci_low": lo, "ci_high": hi, "seeds": len(a),
            "steps": len(a[0]), "resampled": "seed pairs, then steps within each seed (the same draws for both arms)",
            "resamples": n_resamples, "level": level, "seed": seed}


def log_ratio_sign_flip_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Seed-level test of a ratio: sign_flip_p of d_s = log(a_s / b_s) (a_s, b_s > 0: e.g. seed s's total
    tool calls in each arm); 3 seeds cannot go below 0.25."""
    return sign_flip_p([math.log(x / y) for x, y in zip(a, b, strict=True)])
