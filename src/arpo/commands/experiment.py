"""`arpo experiment`: controlled end-to-end experiments (src/arpo/experiments/)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from arpo.commands import HELP, POS_INT

if TYPE_CHECKING:
    from arpo.experiments import arpo_vs_grpo, svamp

EXAMPLES = """examples:
  arpo experiment arpo-vs-grpo                       # the full run: 3 seeds per method \
(see docs/experiment_arpo_vs_grpo.md)
  arpo experiment arpo-vs-grpo --quick --out /tmp/q  # smoke test: 1 seed, a few steps (not a result)
  arpo experiment arpo-vs-grpo lr=2e-4 initial_rollouts=2 --seeds 5 --steps 60
  arpo experiment arpo-vs-grpo --seeds 1 --set sft_from=runs/experiments/arpo_vs_grpo/sft/checkpoints/step_000450/model
  arpo experiment svamp-arpo-vs-grpo                 # SVAMP, SmolLM2-135M (docs/experiment_svamp_arpo_vs_grpo.md)
  arpo experiment svamp-arpo-vs-grpo sft_from=runs/quickstart/sft --seeds 3 --steps 30
  arpo experiment svamp-arpo-vs-grpo --quick --out /tmp/sq   # tiny random model: plumbing only
  arpo experiment hop2-arpo-vs-grpo                  # hop2 (two lookups), SmolLM2-135M, blind: dev only
  arpo experiment hop2-arpo-vs-grpo report_test=true # freeze the dev selection, report hop2:test once
  arpo experiment hop2-arpo-vs-grpo "methods=[arpo,grpo,aepo]" --seeds 3 --steps 20
  arpo experiment hop2-stats --results runs/hop2/results.json   # recompute its statistics, print the tables
  arpo experiment branch-rules --seeds 5 --steps 20  # branch rules on hop2, equal trajectories and equal
                                                     # executed tool calls (docs/branch_rules.md)
  arpo experiment branch-rules --quick --out /tmp/br # tiny random model: plumbing only
  arpo experiment branching models=[runs/quickstart/sft,runs/quickstart/arpo]   \
# branch rule settings (docs/branching.md)

Any field of arpo.experiments.arpo_vs_grpo.ExperimentConfig (svamp-arpo-vs-grpo:
arpo.experiments.svamp.SvampExperimentConfig; hop2-arpo-vs-grpo: arpo.experiments.hop2.Hop2ExperimentConfig;
branching: arpo.experiments.branching.BranchingConfig; branch-rules: arpo.experiments.branch_rules.BranchRulesConfig)
can be set as key=value. Writes
OUT/results.json (settings, per-method per-seed curves, the tool-call ratio), OUT/accuracy_vs_step.png
and OUT/accuracy_vs_tool_calls.png."""


def register(sub) -> None:
    p = sub.add_parser("experiment", help="controlled experiments, e.g. ARPO vs GRPO on a generated tool task",
                       description="Run a controlled experiment end to end with arpo's own pipeline.",
                       epilog=EXAMPLES, formatter_class=HELP)
    p.add_argument("name", choices=["arpo-vs-grpo", "svamp-arpo-vs-grpo", "hop2-arpo-vs-grpo", "hop2-stats",
                                    "branching", "branch-rules"])
    p.add_argument("--seeds", type=POS_INT, default=None, help="RL seeds per method (default 3; --quick: 1)")
    p.add_argument("--steps", type=POS_INT, default=None, help="RL steps per run (default 40; svamp: 30)")
    p.add_argument("--out", default=None, help="output dir (default runs/experiments/arpo_vs_grpo)")
    p.add_argument("--threads", type=POS_INT, default=None, help="torch CPU threads (default 2)")
    p.add_argument("--quick", action="store_true", help="tiny smoke-test settings (1 seed, few steps)")
    p.add_argument("--results", default=None, metavar="RESULTS_JSON",
                   help="hop2-stats: the hop2 results.json whose statistics section is recomputed (in place)")
    p.add_argument("overrides", nargs="*",
                   help="ExperimentConfig fields as key=value right after the name, e.g. lr=2e-4")
    p.add_argument("--set", dest="more", action="append", default=[], metavar="KEY=VALUE",
                   help="an ExperimentConfig field, anywhere on the line (repeatable)")
    p.set_defaults(func=run)


def run(args) -> int:
    from arpo.config import from_dict, parse_overrides

    # one of two experiments, each with its own config class and run()
    ExperimentConfig: type[svamp.SvampExperimentConfig] | type[arpo_vs_grpo.ExperimentConfig]
    run_experiment: Callable[[svamp.SvampExperimentConfig], dict] | Callable[[arpo_vs_grpo.ExperimentConfig], dict]

    if args.name == "branching":
        return run_branching(args)
    if args.name in ("hop2-arpo-vs-grpo", "branch-rules"):
        return run_hop2(args)
    if args.name == "hop2-stats":
        return run_hop2_stats(args)
    if args.name == "svamp-arpo-vs-grpo":
        from arpo.experiments.svamp import SvampExperimentConfig as ExperimentConfig
        from arpo.experiments.svamp import run as run_experiment
    else:
        from arpo.experiments.arpo_vs_grpo import ExperimentConfig
        from arpo.experiments.arpo_vs_grpo import run as run_experiment

    over = parse_overrides(list(args.overrides) + list(args.more))
    for key in ("seeds", "steps", "out", "threads"):
        if getattr(args, key) is not None:
            over[key] = getattr(args, key)
    if args.quick:
        base = ExperimentConfig.quick()
        cfg = from_dict(ExperimentConfig, {**_fields(base), **over})
        if "out" not in over:
            cfg.out = cfg.out + "_quick"
    else:
        cfg = from_dict(ExperimentConfig, over)
    res = run_experiment(cfg)
    s = res["summary"]
    print(json.dumps({"out": cfg.out, "wall_seconds": round(res["wall_seconds"], 1),
                      "start_accuracy": s["start_accuracy"], "target_accuracy": s.get("target_accuracy"),
                      "tool_call_ratio": s.get("tool_call_ratio"),
                      **({"per_seed_ratio_spread": s["per_seed_ratio_spread"]} if "per_seed_ratio_spread" in s else {}),
                      **{m: s[m] for m in cfg.methods if m in s}}, indent=1, default=str))
    return 0


def run_hop2(args) -> int:
    """hop2-arpo-vs-grpo and branch-rules: dev statistics always; test only with report_test=true
    (experiments/hop2.py, experiments/branch_rules.py)."""
    from arpo.config import from_dict, parse_overrides
    from arpo.experiments import branch_rules, hop2

    Hop2ExperimentConfig: type[hop2.Hop2ExperimentConfig] = hop2.Hop2ExperimentConfig
    run_experiment: Callable[..., dict] = hop2.run
    if args.name == "branch-rules":
        Hop2ExperimentConfig, run_experiment = branch_rules.BranchRulesConfig, branch_rules.run

    over = parse_overrides(list(args.overrides) + list(args.more))
    for key in ("seeds", "steps", "out", "threads"):
        if getattr(args, key) is not None:
            over[key] = getattr(args, key)
    if args.quick:
        cfg = from_dict(Hop2ExperimentConfig, {**_fields(Hop2ExperimentConfig.quick()), **over})
        if "out" not in over:
            cfg.out = cfg.out + "_quick"
    else:
        cfg = from_dict(Hop2ExperimentConfig, over)
    res = run_experiment(cfg)
    print(json.dumps({"out": cfg.out, "wall_seconds": round(res["wall_seconds"], 1), "start_dev": res["start_dev"],
                      "dev": res["dev"], "test": res["test"],
                      **({"matched_calls": res["matched_calls"]} if "matched_calls" in res else {})},
                     indent=1, default=str))
    return 0


def run_hop2_stats(args) -> int:
    """hop2-stats: recompute the statistics section of a hop2 results.json (experiments/hop2_stats.py)."""
    from pathlib import Path

    from arpo.errors import ArpoError
    from arpo.experiments.hop2_report import report
    from arpo.experiments.hop2_stats import recompute

    if not args.results:
        raise ArpoError("hop2-stats needs --results PATH (a results.json of hop2-arpo-vs-grpo)")
    recompute(args.results)
    print(report(json.loads(Path(args.results).read_text())), end="")  # the tables docs/experiment_hop2.md quotes
    return 0


def _fields(cfg) -> dict:
    import dataclasses

    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def run_branching(args) -> int:
    from arpo.config import from_dict, parse_overrides
    from arpo.experiments.branching import BranchingConfig
    from arpo.experiments.branching import run as run_study

    over = parse_overrides(list(args.overrides) + list(args.more))
    for key in ("out", "threads"):
        if getattr(args, key) is not None:
            over[key] = getattr(args, key)
    cfg = from_dict(BranchingConfig, over)
    res = run_study(cfg)
    keys = ("branch_rate", "branches", "delta_entropy_mean", "initial_entropy_mean", "post_tool_entropy_mean",
            "mixed_groups", "branch_share_in_mixed", "branch_outcome_differs", "corr_p_branch_outcome_var")
    print(json.dumps({"out": cfg.out, "wall_seconds": round(res["wall_seconds"], 1),
                      "models": {m: {n: {k: r[k] for k in keys} for n, r in rs.items()}
                                 for m, rs in res["models"].items()}}, indent=1, default=str))
    return 0
