"""analysis/branches.py against hand-computed values, and read back from a real training run's dump."""

from __future__ import annotations

import pytest

from arpo.analysis import branches as B

SPANS = [[10, 20], [30, 40]]  # the two tool results every trajectory here has (branches inherit them)


def _t(i, parent, correct, h0=None, hs=(), decisions=(), at=None):
    return {"id": i, "parent": parent, "correct": correct, "initial_entropy": h0, "step_entropies": list(hs),
            "decisions": [{"branched": b} for b in decisions], "branch_at": at,
            "tool_calls": [{"result_span": sp} for sp in SPANS]}


TREES = [
    {"trajectories": [_t(0, None, True, 0.5, [0.7, 0.4], [True, False]), _t(1, None, False, 0.2, [0.1], [False]),
                      _t(2, 0, False, 0.5, [0.7, 0.9], [False], at=20), _t(3, 0, True, 0.5, [0.7, 0.4], at=40)]},
    {"trajectories": [_t(0, None, True, 1.0, [1.5], [False]), _t(1, None, True, 0.0, [0.0]),
                      _t(2, None, True, 0.3, [0.4], [True]), _t(3, 2, True, 0.3, [0.4], at=20)]},
]


def test_entropy_after_results_by_hand():
    e = B.entropy_after_results(TREES)
    # result 1, globals only: 0.7-0.5=0.2, 0.1-0.2=-0.1, 1.5-1.0=0.5, 0.0-0.0=0, 0.4-0.3=0.1
    assert e["1"]["n"] == 5
    assert e["1"]["delta_entropy_mean"] == pytest.approx((0.2 - 0.1 + 0.5 + 0.0 + 0.1) / 5)
    assert e["1"]["share_rising"] == pytest.approx(3 / 5)  # 0 is not a rise
    assert e["2"] == {"n": 1, "delta_entropy_mean": pytest.approx(-0.1), "share_rising": 0.0}


def test_branch_outcomes_by_hand():
    o = B.branch_outcomes(TREES)
    # branches: tree 0: 2 (wrong vs right parent: differs; right vs right: same), tree 1: 1 (same)
    assert o["branches"] == 3 and o["branch_outcome_differs"] == pytest.approx(1 / 3)
    # fresh pairs: tree 0 {T, F} -> 1 of 1; tree 1 {T, T, T} -> 0 of 3
    assert o["global_pairs_differ"] == pytest.approx(1 / 4)
    assert o["branch_decisions"] == 6 and o["branch_rate"] == pytest.approx(2 / 6)
    assert o["mixed_trees"] == 0.5 and o["trees"] == 2
    # after result 1: tree 0's branch 2 (differs) and tree 1's branch 3 (same); after result 2: branch 3 (same)
    assert o["by_result"] == {"1": {"branches": 2, "branch_outcome_differs": 0.5},
                              "2": {"branches": 1, "branch_outcome_differs": 0.0}}


def test_a_run_without_branches_reports_none_not_zero():
    o = B.branch_outcomes([{"trajectories": [_t(0, None, True), _t(1, None, True)]}])
    assert o["branches"] == 0 and o["branch_outcome_differs"] is None and o["branch_rate"] is None
    assert o["global_pairs_differ"] == 0.0


def test_read_run_trees_reads_what_training_kept(tiny_run):
    from arpo.training.rollout_log import read_run_trees

    trees = read_run_trees(tiny_run)
    assert trees and all("trajectories" in t and "step" in t for t in trees)
    assert [t["step"] for t in trees] == sorted(t["step"] for t in trees)
    s = B.study(trees)
    assert s["trees"] == len(trees) and s["entropy_after_results"] and s["branches"] > 0
