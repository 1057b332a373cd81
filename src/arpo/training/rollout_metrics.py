"""Rollout metrics of a step (reward, accuracy, format and tool rates, tool calls, branches, entropy),
computed from plain per-trajectory numbers so that the ranks of a distributed run can gather them
and compute the metrics of the global batch."""

from __future__ import annotations

import statistics


def issued_calls(t) -> int:
    """Tool calls trajectory `t` issued itself: a branch inherits its parent's calls up to the branch
    point (results delivered at or before branch_token_index), which ran once, for the parent."""
    at = t.branch_token_index
    if t.parent_id is None or at is None:
        return len(t.traj.tool_calls)
    return sum(not (0 < c.result_span[1] <= at) for c in t.traj.tool_calls)


def probe_calls(tree) -> int:
    """Tool calls AEPO's probe pass ran for this tree's prompt (rollout/arpo.py, dynamic_budget): they
    ran, so they count in tool_calls_issued, though the probe's trajectory is not in the tree."""
    return int((tree.budget or {}).get("tool_calls", 0))


def traj_stats(trees) -> list[dict]:
    """What rollout metrics are computed from: plain numbers, one dict per trajectory (so the ranks
    of a distributed run can gather them and compute the metrics of the global batch). A tree's
    probe calls ride on its first trajectory ("probe")."""
    return [{"reward": t.reward, "correct": float(t.result.correct), "format_error": float(not t.result.format_ok),
             "calls": [(c.tool, c.ok, c.elapsed_s) for c in t.traj.tool_calls], "post": list(t.step_entropies),
             "init": t.initial_entropy, "branch": t.parent_id is not None, "length": t.traj.n_generated_tokens,
             "decisions": [(d["delta_entropy"], d["branched"]) for d in t.branch_decisions],
             "issued": issued_calls(t), "probe": probe_calls(tree) if i == 0 else 0,
             "group_size": len(tree.trajectories), "group_constant": constant_rewards(tree),
             "ended": t.traj.finish_reason}
            for tree in trees for i, t in enumerate(tree.trajectories)]


def constant_rewards(tree) -> bool:
    """Whether every trajectory of the group got one reward (its advantages are all 0: no gradient)."""
    return len({t.reward for t in tree.trajectories}) <= 1


def metrics_of(stats: list[dict]) -> dict:
    rewards = [s["reward"] for s in stats]
    calls = [c for s in stats for c in s["calls"]]  # (tool, ok, elapsed_s)
    post = [h for s in stats for h in s["post"]]
    init = [s["init"] for s in stats if s["init"] is not None]
    decisions = [d for s in stats for d in s.get("decisions", ())]  # (ΔH, branched) of every branch decision
    m = {
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "accuracy": statistics.fmean(s["correct"] for s in stats),
        "format_error_rate": statistics.fmean(s["format_error"] for s in stats),
        # the protocol followed AND at least one tool used (what cold-start SFT and RL must teach)
        "tool_format_rate": statistics.fmean((not s["format_error"]) and len(s["calls"]) > 0 for s in stats),
        "tool_calls_per_traj": len(calls) / len(stats),
        # calls the rollouts actually ran (a branch's inherited prefix calls once; AEPO's probe pass
        # included): ARPO's saving
        "tool_calls_issued": sum(s.get("issued", len(s["calls"])) + s.get("probe", 0) for s in stats),
        "probe_tool_calls": sum(s.get("probe", 0) for s in stats),  # of which AEPO's probe ran
        "tool_failures": sum(not ok for _, ok, _ in calls),
        "branches": sum(s["branch"] for s in stats),
        # of the branch decisions taken (one per tool result while the group had room), the fraction
        # that branched, and their mean ΔH = H_after_tool − H_initial (rollout/arpo.py)
        "branch_decisions": len(decisions),
        "branch_rate": statistics.fmean(b for _, b in decisions) if decisions else 0.0,
        "delta_entropy": statistics.fmean(h for h, _ in decisions) if decisions else 0.0,
        "trajectories": len(stats),
        "initial_entropy": statistics.fmean(init) if init else 0.0,
        "post_tool_entropy": statistics.fmean(post) if post else 0.0,
        "response_length": statistics.fmean(s["length"] for s in stats),
        "tool_seconds": sum(e for _, _, e in calls),
    }
    if all("group_size" in s for s in stats):  # each trajectory carries 1/|group| of its group: exact under gathers
        groups = sum(1 / s["group_size"] for s in stats)
        m["constant_groups"] = sum(s["group_constant"] / s["group_size"] for s in stats) / groups
    ended = [s["ended"] for s in stats if s.get("ended")]  # how trajectories ended: answer, eos, length, tool_cap
    for reason in sorted(set(ended)):
        m[f"ended/{reason}"] = ended.count(reason) / len(stats)
    n_calls = [len(s["calls"]) for s in stats]  # the distribution of tool calls per trajectory
    for k in range(max(n_calls) + 1):
        m[f"calls_frac/{k}"] = n_calls.count(k) / len(stats)
    for tool in sorted({c[0] for c in calls}):
        m[f"tool_calls_per_traj/{tool}"] = sum(c[0] == tool for c in calls) / len(stats)
    return m
