"""experiments/clustered.py against hand-computed values (issue 38): seeds and question clusters."""

from __future__ import annotations

import pytest

from experiments import blind_protocol as P
from experiments import clustered as C


def test_cluster_sums_and_the_resampled_mean():
    t, n, labels = C.cluster_sums([[1, 0, 1, 1], [0, 0, 1, 0]], ["a", "a", "b", "c"])
    assert (t, n, labels) == ([[1, 1, 1], [0, 1, 0]], [2, 1, 1], ["a", "b", "c"])
    # every cell once: (1 + 1 + 1 + 0 + 1 + 0) / (2 seeds · 4 questions)
    assert C.resampled_mean(t, n, [0, 1], [0, 1, 2]) == 4 / 8
    # seed 0 twice, cluster a (2 questions) and c: (1 + 1 + 1 + 1) / (2 · (2 + 1))
    assert C.resampled_mean(t, n, [0, 0], [0, 2]) == 4 / 6
    with pytest.raises(ValueError, match="seed 1 has 3 questions"):
        C.cluster_sums([[1, 0, 1, 1], [0, 0, 1]], ["a", "a", "b", "c"])


def test_the_crossed_bootstrap_counts_the_seeds():
    # one seed: a fixed per-question score, one cluster: nothing varies
    c = C.crossed_bootstrap_mean([[0.5, 0.5, 0.5, 0.5]], ["k"] * 4)
    assert (c["mean"], c["ci_low"], c["ci_high"]) == (0.5, 0.5, 0.5)
    # the same mean from two seeds that disagree on everything: a replicate draws seed 0 twice (mean 1,
    # p 1/4), seed 1 twice (0, p 1/4) or one of each (0.5): the 51st of 2000 is 0, the 1950th is 1
    c = C.crossed_bootstrap_mean([[1, 1, 1, 1], [0, 0, 0, 0]], ["k"] * 4)
    assert (c["mean"], c["ci_low"], c["ci_high"], c["seeds"], c["clusters"]) == (0.5, 0.0, 1.0, 2, 1)


def test_the_crossed_bootstrap_counts_the_clusters():
    """20 questions in 10 pairs that are always both right or both wrong: the pair is the unit, so the
    interval is about √2 wider than the one that takes the 20 questions as independent."""
    x = [[1.0] * 10 + [0.0] * 10]
    pairs = [f"c{i // 2}" for i in range(20)]
    alone = [f"q{i}" for i in range(20)]
    wide = C.crossed_bootstrap_mean(x, pairs, seed=1)
    narrow = C.crossed_bootstrap_mean(x, alone, seed=1)
    assert wide["mean"] == narrow["mean"] == 0.5 and wide["clusters"] == 10 and narrow["clusters"] == 20
    ratio = (wide["ci_high"] - wide["ci_low"]) / (narrow["ci_high"] - narrow["ci_low"])
    assert 1.2 < ratio < 1.7  # sd 0.158 vs 0.112
    # every question its own cluster and one seed: protocol's question bootstrap, up to the random draws
    q = P.bootstrap_mean_ci(x[0], seed=1)
    assert abs(q["ci_low"] - narrow["ci_low"]) <= 0.051 and abs(q["ci_high"] - narrow["ci_high"]) <= 0.051


def test_crossed_bootstrap_diff_hand_cases():
    # the same single run on both sides: clusters are drawn once for both arms, so every Δ* is 0
    d = C.crossed_bootstrap_diff([[1, 0, 1]], [[1, 0, 1]], ["a", "b", "c"])
    assert (d["diff"], d["ci_low"], d["ci_high"]) == (0.0, 0.0, 0.0)
    # a: two runs right; b: one run right, one wrong; b* has mean 0 (1/4), 0.5 (1/2) or 1 (1/4)
    d = C.crossed_bootstrap_diff([[1], [1]], [[0], [1]], ["a"])
    assert (d["diff"], d["ci_low"], d["ci_high"], d["seeds"]) == (0.5, 0.0, 1.0, [2, 2])


def test_seed_permutation_p_exact():
    assert C.seed_permutation_p([1, 2, 3], [4, 5, 6]) == pytest.approx(2 / 20)  # only the observed split and its mirror
    assert C.seed_permutation_p([1], [2]) == 1.0
    # issue 38's seed-level test on the hop2 test accuracies (ARPO vs GRPO, AEPO vs GRPO)
    grpo = [0.5833333333333334, 0.8333333333333334, 0.7833333333333333]
    assert C.seed_permutation_p([0.75, 0.8333333333333334, 0.85], grpo) == pytest.approx(0.6)
    assert C.seed_permutation_p([0.75, 0.9333333333333333, 0.8666666666666667], grpo) == pytest.approx(0.4)


def test_sign_flip_p_exact():
    assert C.sign_flip_p([1, 2, 3]) == 0.25  # only all-plus and all-minus reach |6|: 2 of 8
    assert C.sign_flip_p([1, 1, -1]) == 1.0  # every signed sum is odd, so |Σ| >= 1 always
    assert C.sign_flip_p([0.2, 0.0, 0.1]) == 0.5  # ±0.2 ± 0.1 reaches 0.3 in 2 of 4 (the 0 doubles both)
    assert C.log_ratio_sign_flip_p([1, 2, 4], [2, 4, 8]) == 0.25


def test_seed_level_pairs_by_seed():
    s = C.seed_level([0.8, 0.7, 0.9], [0.6, 0.7, 0.5])
    assert s["diff"] == pytest.approx(0.2) and (s["wins"], s["losses"]) == (2, 0)
    assert s["per_seed_diff"] == pytest.approx([0.2, 0.0, 0.4]) and s["p_sign_flip"] == 0.5
    assert "p_sign_flip" not in C.seed_level([0.8, 0.7], [0.6])


def test_cluster_paired_counts_clusters_not_questions():
    # clusters A = q0 q1, B = q2 q3; a: 1 1 0 0, b: 0 1 0 1 -> D_A = 1 - .5 (win), D_B = 0 - .5 (loss)
    c = C.cluster_paired([[1, 1, 0, 0]], [[0, 1, 0, 1]], ["A", "A", "B", "B"])
    assert (c["wins"], c["losses"], c["ties"], c["p_sign_test"]) == (1, 1, 0, 1.0)
    # two seeds of a that cancel in cluster A: a tie
    c = C.cluster_paired([[1, 1, 0, 0], [0, 0, 0, 0]], [[1, 0, 0, 0], [0, 0, 0, 0]], ["A", "A", "B", "B"])
    assert (c["wins"], c["losses"], c["ties"]) == (1, 0, 1)


def test_two_stage_ratio_ci_counts_the_seeds():
    # one seed: the step bootstrap; units (1, 1) and (3, 1): 1 (p 1/4), 2 (1/2), 3 (1/4)
    r = C.two_stage_ratio_ci([[1, 3]], [[1, 1]])
    assert (r["ratio"], r["ci_low"], r["ci_high"]) == (2.0, 1.0, 3.0)
    # two seeds, steps alike within a seed: the step-only bootstrap of the seed sums (6/4 every step) has
    # zero width; drawing seeds gives 1 (seed 0 twice), 1.5 or 2 (seed 1 twice)
    a, b = [[2, 2], [4, 4]], [[2, 2], [2, 2]]
    assert P.bootstrap_ratio_ci([6, 6], [4, 4])["ci_high"] == 1.5
    r = C.two_stage_ratio_ci(a, b)
    assert (r["ratio"], r["ci_low"], r["ci_high"], r["seeds"], r["steps"]) == (1.5, 1.0, 2.0, 2, 2)
    with pytest.raises(ValueError):
        C.two_stage_ratio_ci([[1, 2]], [[1]])
