"""The branching study: its summary of rollout trees (hand-made) and its plumbing (tiny model)."""

import json
from types import SimpleNamespace as NS

import pytest

from experiments import branching as B


def traj(correct, parent=None, decisions=(), h0=0.1, post=(), at=None):
    return NS(parent_id=parent, branch_token_index=at, initial_entropy=h0, step_entropies=list(post),
              branch_decisions=[{"delta_entropy": d, "probability": p, "branched": b} for d, p, b in decisions],
              reward=float(correct), result=NS(correct=correct), traj=NS(tool_calls=[]))


class _Tree(list):
    """A rollout tree as summarize_trees reads it: len() and .trajectories."""

    @property
    def trajectories(self):
        return list(self)


def test_summarize_trees_hand_values():
    mixed = _Tree([traj(True, decisions=[(0.2, 0.54, True)], post=[0.3]),
                   traj(False, parent=0, at=5),  # the branch's outcome differs from its parent's
                   traj(False, decisions=[(-0.1, 0.48, False)], post=[0.0])])
    uniform = _Tree([traj(False, decisions=[(0.0, 0.5, True)], post=[0.1]), traj(False, parent=0, at=5)])
    s = B.summarize_trees([mixed, uniform])
    assert (s["prompts"], s["trajectories"], s["globals"], s["branches"], s["branch_decisions"]) == (2, 5, 3, 2, 3)
    assert s["branch_rate"] == pytest.approx(2 / 3)
    assert s["delta_entropy_mean"] == pytest.approx(0.1 / 3)
    assert s["initial_entropy_mean"] == pytest.approx(0.1) and s["post_tool_entropy_mean"] == pytest.approx(0.4 / 3)
    assert s["mixed_groups"] == 0.5 and s["branch_share_in_mixed"] == 0.5 and s["branch_outcome_differs"] == 0.5
    assert s["p_branch_when_right"] == pytest.approx(0.54) and s["p_branch_when_wrong"] == pytest.approx(0.49)
    assert s["accuracy"] == pytest.approx(0.2)
    assert s["corr_p_branch_outcome_var"] > 0  # the highest P sat in the mixed (uncertain) group


def test_branching_study_plumbing(tmp_path):
    cfg = B.BranchingConfig(out=str(tmp_path / "b"), models=["tiny-random"], data="svamp:train[0:2]", group_size=4,
                            initial_rollouts=2, max_response_tokens=16, threads=1,
                            settings={"paper": {}, "β 5": {"entropy_weight": 5.0}})
    res = B.run(cfg)
    data = json.loads((tmp_path / "b" / "results.json").read_text())
    assert list(data["models"]["tiny-random"]) == ["paper", "β 5"]
    assert all(r["trajectories"] == 8 and r["prompts"] == 2 for r in data["models"]["tiny-random"].values())
    assert (tmp_path / "b" / "branching.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert res["settings"]["β 5"] == {"entropy_weight": 5.0}
