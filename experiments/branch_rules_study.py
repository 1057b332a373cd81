"""Branch rules compared under the blind protocol, at equal trajectories and at equal executed tool
calls (issue 41; docs/branch_rules.md):

    arpo experiment branch-rules [--seeds 5] [--steps 20] [--out DIR] [report_test=true]
    arpo experiment branch-rules task=webhop [--seeds 5] [--steps 6] [--out DIR] [report_test=true]

It is hop2's experiment (experiments/hop2_study.py: SFT, RL per seed and arm, dev curves, the step chosen
on dev, test once through blind_protocol.Ledger, the seed- and cluster-aware `statistics` of hop2_stats.py,
calls to reach an accuracy, and analysis/branches.py's branch placement and outcome changes per arm)
with arms `preset@rule`: the preset with `rollout.branch_rule: rule` (experiments/common.train_config).
Every arm has the same M trajectories per prompt and the same prompts at each step (same seeds).
The last arm is the base of every comparison (default: arpo, the paper's rule).

Budget-matched (experiments/budget_matched.py): each arm spends a different number of executed tool
calls per step, so the results also hold `matched_calls` and `matched_calls_per_pair`, each arm's dev
accuracy read at equal cumulative executed training calls.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arpo.errors import ArpoError
from experiments import blind_protocol as P
from experiments import hop2_study
from experiments.budget_matched import matched_calls, matched_report, pair_matched_calls
from experiments.hop2_stats import bootstrap_opts

# what task=webhop changes (where the setting still has hop2's value): examples/deep_search's SFT
# (scripted trajectories of webhop:train[0:120] through the real tools; sft.yaml as it is) and RL
# (train.yaml), on a web this experiment serves (`arpo web serve --corpus webhop:pages`, WEB_CORPUS)
WEBHOP = {"train_config": "examples/deep_search/train.yaml", "eval_data": "webhop:dev", "test_data": "webhop:test",
          "sft_config": "examples/deep_search/sft.yaml", "sft_data": "webhop:train[0:120]", "sft_overrides": []}
WEB_CORPUS = "webhop:pages"


@dataclass
class BranchRulesConfig(hop2_study.Hop2ExperimentConfig):
    out: str = "runs/experiments/branch_rules"
    task: str = "hop2"  # hop2 | webhop (docs/branch_rules.md)
    # task=webhop: the port of the local web the experiment serves on 127.0.0.1 for its SFT data,
    # rollouts and evaluations (none when train_overrides sets tools.web.url: your own). Part of the
    # task: the pages' URLs, port included, are in the tool results the model reads and copies
    web_port: int = 8090
    # arms: a preset, or preset@rule (rollout.branch_rule); the last is the base of every comparison
    methods: list[str] = field(default_factory=lambda: ["arpo@zscore", "arpo@top_entropy", "arpo@outcome_open",
                                                        "aepo", "grpo", "arpo"])
    seeds: int = 5
    steps: int = 20
    eval_every: int = 4
    budget_fractions: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0])  # of C_max

    @classmethod
    def quick(cls, **over) -> BranchRulesConfig:
        """A smoke-test size on the tiny random model (plumbing, not a result)."""
        base = {k: getattr(hop2_study.Hop2ExperimentConfig.quick(), k) for k in
                ("sft_data", "eval_data", "test_data", "sft_overrides", "train_overrides")}
        base.update(seeds=1, steps=1, eval_every=1, methods=["arpo@top_entropy", "arpo"],
                    out="runs/experiments/branch_rules_quick")
        base["train_overrides"] = [*base["train_overrides"], "agent.max_response_tokens=16"]
        base.update(over)
        return cls(**base)


def with_task(cfg: BranchRulesConfig) -> BranchRulesConfig:
    """The config with task=webhop's data, SFT and RL configs where they still hold hop2's defaults;
    an error naming the key for a setting that cannot work."""
    if cfg.task not in ("hop2", "webhop"):
        raise ArpoError(f"task: {cfg.task!r}; choose hop2 or webhop")
    if not cfg.methods or len(set(cfg.methods)) != len(cfg.methods):
        raise ArpoError(f"methods: {cfg.methods}; give distinct arms (preset or preset@rule), the base last")
    if not all(0 < f <= 1 for f in cfg.budget_fractions):
        raise ArpoError(f"budget_fractions: {cfg.budget_fractions}; each must be in (0, 1]")
    if cfg.task == "hop2":
        return cfg
    default = BranchRulesConfig()
    changes: dict[str, Any] = {k: v for k, v in WEBHOP.items() if getattr(cfg, k) == getattr(default, k)}
    return dataclasses.replace(cfg, **changes)


def own_web_url(cfg: BranchRulesConfig) -> str | None:
    """The tools.web.url that train_overrides sets (a web you serve), else None."""
    urls = [o.partition("=")[2].strip() for o in cfg.train_overrides if o.partition("=")[0].strip() == "tools.web.url"]
    return urls[-1] if urls else None


def webhop_sft_rows(data: str, url: str) -> list[dict]:
    """The scripted webhop trajectories of `data` through the real web_search and browse tools at `url`
    with the task's result sizes (what `arpo web sft-data` writes for examples/deep_search/run.sh)."""
    from arpo.data import webhop  # noqa: PLC0415 - the web tools load httpx; kept out of this light module's import
    from arpo.data.sources import iter_rows  # noqa: PLC0415
    from arpo.sft.rows import convert_rows  # noqa: PLC0415
    from arpo.sft.web import webhop_to_deep_search  # noqa: PLC0415
    from arpo.tools import build_tools  # noqa: PLC0415

    tools = build_tools(list(webhop.TOOLS), web={"url": url, **webhop.WEB})
    try:
        rows, reasons = convert_rows([r for _, r in iter_rows(data)],
                                     lambda r: webhop_to_deep_search(r, tools["web_search"], tools["browse"]),
                                     None, False, "webhop trajectories")
    finally:
        tools.close()
    if not rows:
        raise ArpoError(f"sft_data: no trajectory of {data} checked out at {url} ({dict(reasons)})")
    return rows


def run(cfg: BranchRulesConfig) -> dict:
    """hop2_study.run with these arms (task=webhop: on a local web served for the run), then the
    budget-matched section (recorded as dev in the ledger)."""
    cfg = with_task(cfg)
    if cfg.task == "webhop" and own_web_url(cfg) is None:
        from arpo.web.process import served_web  # noqa: PLC0415 - starts a server; only task=webhop needs one

        with served_web(WEB_CORPUS, cfg.web_port) as url:
            return run(dataclasses.replace(cfg, train_overrides=[*cfg.train_overrides, f"tools.web.url={url}"]))
    web_url = own_web_url(cfg)

    def webhop_rows() -> tuple[str, list[dict]]:
        return "sft_webhop.jsonl", webhop_sft_rows(cfg.sft_data, str(web_url))
    res = hop2_study.run(cfg, webhop_rows if cfg.task == "webhop" else None)
    opts = bootstrap_opts(res["settings"])
    res["matched_calls"] = matched_calls(res["runs"], list(cfg.budget_fractions), opts)
    res["matched_calls_per_pair"] = pair_matched_calls(res["runs"], opts)
    ledger = P.Ledger(Path(cfg.out) / "protocol.json")
    top = res["matched_calls"]["levels"][-1]
    for m, a in top["arms"].items():
        ledger.record(f"{m}/accuracy_at_matched_calls", a["accuracy_mean"], "dev", calls=top["calls"],
                      data=cfg.eval_data)
    report = Path(cfg.out) / "report.md"
    report.write_text(report.read_text() + matched_report(res))
    path = Path(cfg.out) / "results.json"
    path.write_text(json.dumps({k: v for k, v in res.items() if k != "figures"}, indent=1, default=str))
    return res
