"""The warning for an RL step where every rollout is malformed: each gets the format penalty (the
paper's reward −1), so every group's rewards are equal, every advantage is 0 and the step learns
nothing — it used to end as "done" without a word (4 of 4 rollouts at −1 on the own-corpus recipe)."""

from __future__ import annotations


def all_malformed_warning(metrics: dict, step: int, total: int) -> str | None:
    """One line naming the step when every trajectory of it broke the output format (metrics of
    training/rollout_metrics.py: `format_error_rate` 1 over `trajectories` > 0), else None."""
    n = int(metrics.get("trajectories", 0) or 0)
    if n < 1 or metrics.get("format_error_rate") != 1.0:
        return None
    return (f"arpo train: warning: step {step}/{total}: all {n} rollouts are malformed (format errors: reward "
            f"{metrics.get('reward_mean', 0):.2f} each), so every advantage is 0 and the step learned nothing; "
            "start from a model that writes the protocol (cold-start SFT: `arpo sft`), or raise "
            "agent.max_response_tokens if the answers are cut off")
