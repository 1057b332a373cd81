"""Does ARPO branch where the policy is uncertain? Rollout-only measurements of the branch rule
under several settings, on one or more models (e.g. an SFT start and RL checkpoints).

    arpo experiment branching models=[runs/quickstart/sft,runs/quickstart/arpo] [data=...] [key=value ...]

For every (model, setting) the same prompts are rolled out with arpo's ARPO scheduler
(rollout/arpo.py; settings are RolloutConfig overrides), scored with the training reward, and
summarised:

* the branch rule's inputs: H_initial, H after tool results, ΔH = H_tool − H_initial, and the
  branch rate (branched decisions / decisions; a decision is taken after each tool result while the
  group has room);
* where the budget went: `mixed_groups` (groups whose rewards differ: the only ones with a
  gradient under group-normalized advantages), `branch_share_in_mixed` (the share of branches that
  landed in mixed groups) and, the direct measure of uncertainty at the branch point,
  `branch_outcome_differs` (the share of branches whose correctness differs from their parent's:
  0 means the branch re-sampled a continuation whose outcome was already decided);
* `p_branch_when_*`: the mean branch probability at decisions whose parent later turned out right
  vs wrong, and `corr_p_branch_outcome_var` — the correlation between the branch probability at a
  decision and the reward variance of that prompt's group (positive: the rule spends more where the
  outcome is uncertain).

Writes OUT/results.json and OUT/branching.png.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import arpo.models
from arpo.data.datasets import load_examples
from arpo.data.prompts import prompts_for
from arpo.rewards import get_reward_fn, score_trees
from arpo.settings import AgentConfig, RewardConfig, RolloutConfig, ToolsConfig
from arpo.tools import tools_from_config
from arpo.training.rollout_metrics import issued_calls
from experiments.common import log, recorded_settings, run_record, start_run

# name -> RolloutConfig overrides; the defaults of RolloutConfig are the paper's settings
DEFAULT_SETTINGS: dict[str, dict] = {
    "paper (β 0.2, τ 0.5)": {},
    "β 1": {"entropy_weight": 1.0},
    "β 5": {"entropy_weight": 5.0},
    "β 5, τ 0.9": {"entropy_weight": 5.0, "branch_threshold": 0.9},
    "top-10 entropy": {"entropy_estimator": "topk"},
    "normalized sum (ref. scale)": {"entropy_reduction": "sum", "entropy_normalize": True},
    "reference mode": {"mode": "reference", "entropy_estimator": "topk", "entropy_reduction": "sum",
                       "entropy_normalize": True},
    "k 50 (H_init over the call)": {"entropy_tokens": 50},
    "AEPO budget + penalty": {"dynamic_budget": True, "consecutive_branch_penalty": 0.05},
}


@dataclass
class BranchingConfig:
    out: str = "runs/experiments/branching"
    models: list[str] = field(default_factory=lambda: ["runs/quickstart/sft"])
    data: str = "svamp:train[2400:2432]"  # RL-style training problems (not the SFT rows)
    template: str | None = "calc"
    tools: list[str] = field(default_factory=lambda: ["python"])
    group_size: int = 8  # M
    initial_rollouts: int = 4  # N
    temperature: float = 1.0
    max_tool_calls: int = 2
    max_response_tokens: int = 64
    prompts_per_batch: int = 16
    settings: dict = field(default_factory=lambda: dict(DEFAULT_SETTINGS))  # name -> rollout overrides
    seed: int = 0
    threads: int = 2


def _corr(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


def summarize_trees(trees) -> dict:
    """The numbers of the module docstring from scored rollout trees."""
    decisions: list[tuple[float, float, bool]] = []  # (delta entropy, branch probability, branched)
    branches: list[tuple[bool, bool]] = []  # (mixed group, the branch's correctness differs from its parent's)
    p_right: list[float] = []
    p_wrong: list[float] = []
    p_var: list[tuple[float, float]] = []
    mixed = 0
    init: list[float] = []
    post: list[float] = []
    for tree in trees:
        ts = tree.trajectories
        rewards = [t.reward for t in ts]
        var = statistics.pvariance(rewards) if len(rewards) > 1 else 0.0
        is_mixed = len(set(rewards)) > 1
        mixed += is_mixed
        for t in ts:
            if t.parent_id is None:  # a branch repeats its parent's H_initial and earlier H_t
                init += [t.initial_entropy] if t.initial_entropy is not None else []
                post += t.step_entropies
            for d in t.branch_decisions:
                decisions.append((d["delta_entropy"], d["probability"], d["branched"]))
                (p_right if t.result.correct else p_wrong).append(d["probability"])
                p_var.append((d["probability"], var))
            if t.parent_id is not None:
                parent = ts[t.parent_id]
                branches.append((is_mixed, t.result.correct != parent.result.correct))
    n = len(trees)
    out = {
        "prompts": n, "trajectories": sum(len(tr) for tr in trees),
        "globals": sum(t.parent_id is None for tr in trees for t in tr.trajectories),
        "branches": len(branches), "branch_decisions": len(decisions),
        "branch_rate": statistics.fmean(b for _, _, b in decisions) if decisions else 0.0,
        "p_branch_mean": statistics.fmean(p for _, p, _ in decisions) if decisions else 0.0,
        "delta_entropy_mean": statistics.fmean(h for h, _, _ in decisions) if decisions else 0.0,
        "delta_entropy_sd": statistics.pstdev(h for h, _, _ in decisions) if len(decisions) > 1 else 0.0,
        "initial_entropy_mean": statistics.fmean(init) if init else 0.0,
        "post_tool_entropy_mean": statistics.fmean(post) if post else 0.0,
        "accuracy": statistics.fmean(float(t.result.correct) for tr in trees for t in tr.trajectories),
        "mixed_groups": mixed / n if n else 0.0,
        "branch_share_in_mixed": statistics.fmean(m for m, _ in branches) if branches else None,
        "branch_outcome_differs": statistics.fmean(d for _, d in branches) if branches else None,
        "p_branch_when_right": statistics.fmean(p_right) if p_right else None,
        "p_branch_when_wrong": statistics.fmean(p_wrong) if p_wrong else None,
        "corr_p_branch_outcome_var": _corr([p for p, _ in p_var], [v for _, v in p_var]),
        "tool_calls_issued_per_traj": (sum(issued_calls(t) for tr in trees for t in tr.trajectories)
                                       / max(1, sum(len(tr) for tr in trees))),
    }
    return out


def measure(model_dir: str, cfg: BranchingConfig, examples: list[dict]) -> dict:
    """Every setting on one model: name -> summarize_trees of the rollouts."""
    from arpo.engine.hf import HFEngine  # noqa: PLC0415 - loads torch; kept out of this light module's import
    from arpo.rollout.arpo import ARPORollout  # noqa: PLC0415 - loads torch; kept out of this light module's import

    model, tok = arpo.models.load_model(model_dir, device="cpu", dtype="float32")
    tools = tools_from_config(ToolsConfig(enabled=list(cfg.tools)))
    reward = RewardConfig()
    agent = AgentConfig(max_tool_calls=cfg.max_tool_calls, max_response_tokens=cfg.max_response_tokens,
                        temperature=cfg.temperature)
    res = {}
    try:
        for name, over in cfg.settings.items():
            rc = dataclasses.replace(RolloutConfig(group_size=cfg.group_size, initial_rollouts=cfg.initial_rollouts,
                                                   seed=cfg.seed), **over)
            ro = ARPORollout(HFEngine(model, tok), tools, agent, rc)
            trees, t0 = [], time.perf_counter()
            for b in range(0, len(examples), cfg.prompts_per_batch):
                chunk = examples[b: b + cfg.prompts_per_batch]
                got = ro.run(prompts_for(chunk, tok, tools, cfg.template), prompt_ids=[e["id"] for e in chunk],
                             seed=cfg.seed * 1000 + b)
                for tr, ex in zip(got, chunk, strict=True):
                    tr.example = ex
                trees += got
            score_trees(trees, get_reward_fn(reward.fn), reward.math_scorer, tools.names)
            res[name] = {**summarize_trees(trees), "overrides": over, "seconds": time.perf_counter() - t0}
            s = res[name]
            log(f"{Path(model_dir).name} · {name}: branch rate {s['branch_rate']:.3f} ({s['branches']} branches), "
                f"ΔH {s['delta_entropy_mean']:+.4f}, H_init {s['initial_entropy_mean']:.4f}, "
                f"outcome differs {s['branch_outcome_differs']}, mixed groups {s['mixed_groups']:.2f}")
    finally:
        tools.close()
    return res


def plot(results: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(results["models"])
    names = list(results["settings"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(names) + 1.6), sharey=True)
    h = 0.8 / max(1, len(models))
    for mi, m in enumerate(models):
        ys = [i + mi * h for i in range(len(names))]
        r = results["models"][m]
        axes[0].barh(ys, [r[n]["branch_rate"] for n in names], height=h, label=Path(m).name)
        axes[1].barh(ys, [r[n]["branch_outcome_differs"] or 0.0 for n in names], height=h, label=Path(m).name)
    axes[0].set_yticks([i + 0.4 - h / 2 for i in range(len(names))], names, fontsize=8)
    axes[0].set_xlabel("branch rate (branched / decisions)")
    axes[1].set_xlabel("branches whose outcome differs from the parent's")
    for ax in axes:
        ax.grid(alpha=0.3, axis="x")
        ax.set_xlim(0, 1)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    p = out / "branching.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def run(cfg: BranchingConfig) -> dict:
    out = start_run(cfg.out, cfg.threads)
    examples = load_examples(cfg.data)
    t0 = time.perf_counter()
    results: dict[str, Any] = {"settings": dict(cfg.settings), "config": recorded_settings(cfg),
               "models": {m: measure(m, cfg, examples) for m in cfg.models}}
    results.update(run_record(t0))  # wall_seconds, load_average_at_end, provenance
    results["plot"] = str(plot(results, out))
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    return results
