"""`arpo experiment NAME`: controlled end-to-end experiments (src/arpo/experiments/), one entry of
STUDIES each: its module's config class (whose quick() is the --quick smoke config) and run(), a
one-line help, and what the command prints of its results."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from arpo.commands import HELP, POS_INT

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
  arpo experiment hop2-stats --results runs/hop2/results.json --out docs/figures   # ... and draw its figures there
  arpo experiment branch-rules --seeds 5 --steps 20  # branch rules on hop2, equal trajectories and equal
                                                     # executed tool calls (docs/branch_rules.md)
  arpo experiment branch-rules task=webhop --steps 6 # the same on webhop (serves its local web on :8090)
  arpo experiment branch-rules --quick --out /tmp/br # tiny random model: plumbing only
  arpo experiment branching models=[runs/quickstart/sft,runs/quickstart/arpo]   \
# branch rule settings (docs/branching.md)

Any field of the study's config class can be set as key=value (or --set key=value): {fields}.
Writes OUT/results.json (settings, per-method per-seed curves, the statistics) and the study's figures."""


def _ratio_summary(res: dict, cfg) -> dict:
    """arpo-vs-grpo, svamp-arpo-vs-grpo: the start, the target accuracy and the tool-call ratio."""
    s = res["summary"]
    return {"out": cfg.out, "wall_seconds": round(res["wall_seconds"], 1),
            "start_accuracy": s["start_accuracy"], "target_accuracy": s.get("target_accuracy"),
            "tool_call_ratio": s.get("tool_call_ratio"),
            **({"per_seed_ratio_spread": s["per_seed_ratio_spread"]} if "per_seed_ratio_spread" in s else {}),
            **{m: s[m] for m in cfg.methods if m in s}}


def _protocol_summary(res: dict, cfg) -> dict:
    """hop2-arpo-vs-grpo, branch-rules: dev statistics always; test only with report_test=true."""
    return {"out": cfg.out, "wall_seconds": round(res["wall_seconds"], 1), "start_dev": res["start_dev"],
            "dev": res["dev"], "test": res["test"],
            **({"matched_calls": res["matched_calls"]} if "matched_calls" in res else {})}


def _branching_summary(res: dict, cfg) -> dict:
    keys = ("branch_rate", "branches", "delta_entropy_mean", "initial_entropy_mean", "post_tool_entropy_mean",
            "mixed_groups", "branch_share_in_mixed", "branch_outcome_differs", "corr_p_branch_outcome_var")
    return {"out": cfg.out, "wall_seconds": round(res["wall_seconds"], 1),
            "models": {m: {n: {k: r[k] for k in keys} for n, r in rs.items()} for m, rs in res["models"].items()}}


def _hop2_stats(args) -> int:
    """hop2-stats: recompute the statistics section of a hop2 results.json (experiments/hop2_stats.py)."""
    import sys
    from pathlib import Path

    from arpo.data.datasets import load_examples
    from arpo.errors import ArpoError
    from arpo.experiments.hop2_report import report
    from arpo.experiments.hop2_stats import SPLIT_DATA, load, refresh, save

    if not args.results:
        raise ArpoError("hop2-stats needs --results PATH (a results.json of hop2-arpo-vs-grpo)")
    results = load(args.results)
    for sp in refresh(results, load_examples):  # webhop files written before question_cluster
        print(f"{sp}: question clusters from the dataset's rows ({results['settings'][SPLIT_DATA[sp]]}; "
              "hop2_stats.question_cluster)", file=sys.stderr)
    save(args.results, results)
    if args.out:  # the figures again, with this version's drawing code
        from arpo.experiments.hop2_figures import plot

        Path(args.out).mkdir(parents=True, exist_ok=True)
        for f in plot(results, Path(args.out)):
            print(f"wrote {f}", file=sys.stderr)
    print(report(results), end="")  # the tables docs/experiment_hop2.md quotes
    if results.get("matched_calls"):  # branch-rules: accuracy at matched executed tool calls
        from arpo.experiments.budget_matched import matched_report

        print(matched_report(results), end="")
    root = Path(args.results).parent
    if (root / "rl").is_dir():  # the runs' eval records are there: what the policies do (experiments/hop2_behaviour.py)
        from arpo.experiments.hop2_behaviour import behaviour, behaviour_table, most_calls, training, training_table

        beh = behaviour(results, root)
        for split in beh:
            print(f"\nAnswers by tool calls, {split} (share of questions; accuracy among them; "
                  "the most common answer):\n\n" + behaviour_table(beh, split, most_calls(results)))
        steps = results["settings"]["steps"]
        print(f"\nTraining samples by tool calls (pooled over seeds and steps 1–{steps}: format error / wrong / "
              f"right; in brackets the samples at step 1 → step {steps}):\n\n"
              + training_table(training(results, root), most_calls(results)))
    return 0


@dataclass(frozen=True)
class Study:
    """One `arpo experiment NAME`. Its module is imported only when the study is run."""

    help: str  # one line for `arpo experiment --help`
    module: str  # arpo.experiments.X, with run(cfg) -> results
    config: str | None = None  # the config class's name in module; its quick() is the --quick config
    printed: Callable[[dict, Any], dict] = _ratio_summary  # (results, cfg) -> what the command prints
    flags: tuple[str, ...] = ("seeds", "steps", "out", "threads")  # the command's flags the config takes
    command: Callable[[Any], int] | None = None  # instead of config + run: the whole command (hop2-stats)

    def config_class(self) -> type:
        return getattr(importlib.import_module(self.module), str(self.config))

    def quick(self):
        """The smoke-test config (plumbing, not a result), or None where the study has none."""
        quick = getattr(self.config_class(), "quick", None)
        return quick() if quick is not None else None

    def run(self, cfg) -> dict:
        return importlib.import_module(self.module).run(cfg)  # looked up now: a test may replace run


STUDIES: dict[str, Study] = {
    "arpo-vs-grpo": Study("ARPO vs GRPO on a generated knowledge-base tool task (docs/experiment_arpo_vs_grpo.md)",
                          "arpo.experiments.arpo_vs_grpo", "ExperimentConfig"),
    "svamp-arpo-vs-grpo": Study("ARPO vs GRPO on SVAMP with SmolLM2-135M (docs/experiment_svamp_arpo_vs_grpo.md)",
                                "arpo.experiments.svamp", "SvampExperimentConfig"),
    "hop2-arpo-vs-grpo": Study("ARPO vs GRPO (vs AEPO) on hop2, blind: dev, test once (docs/experiment_hop2.md)",
                               "arpo.experiments.hop2", "Hop2ExperimentConfig", _protocol_summary),
    "hop2-stats": Study("recompute the statistics of a hop2 results.json (--results) and print its tables",
                        "arpo.experiments.hop2_stats", command=_hop2_stats),
    "branching": Study("branch rule settings on fixed models, no training (docs/branching.md)",
                       "arpo.experiments.branching", "BranchingConfig", _branching_summary, flags=("out", "threads")),
    "branch-rules": Study("branch rules on hop2 or webhop at equal trajectories and tool calls (docs/branch_rules.md)",
                          "arpo.experiments.branch_rules_study", "BranchRulesConfig", _protocol_summary),
}


def register(sub) -> None:
    studies = "\n".join(f"  {n:<20} {st.help}" for n, st in STUDIES.items())
    fields = "; ".join(f"{n}: {st.module}.{st.config}" for n, st in STUDIES.items() if st.config)
    p = sub.add_parser("experiment", help="controlled experiments, e.g. ARPO vs GRPO on a generated tool task",
                       description="Run a controlled experiment end to end with arpo's own pipeline.\n\n"
                                   f"studies:\n{studies}",
                       epilog=EXAMPLES.format(fields=fields), formatter_class=HELP)
    p.add_argument("name", choices=list(STUDIES), metavar="NAME", help="the study, one of those listed above")
    p.add_argument("--seeds", type=POS_INT, default=None, help="RL seeds per method (default 3; --quick: 1)")
    p.add_argument("--steps", type=POS_INT, default=None, help="RL steps per run (default 40; svamp: 30)")
    p.add_argument("--out", default=None, help="output dir (default runs/experiments/arpo_vs_grpo); hop2-stats: "
                   "draw the file's figures there")
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
    from arpo.errors import ArpoError

    study = STUDIES[args.name]
    if study.command is not None:
        return study.command(args)
    over = parse_overrides(list(args.overrides) + list(args.more))
    for key in study.flags:
        if getattr(args, key) is not None:
            over[key] = getattr(args, key)
    cls = study.config_class()
    if args.quick:
        base = study.quick()
        if base is None:
            raise ArpoError(f"--quick: {args.name} has no smoke-test config; set its fields as key=value instead")
        cfg = from_dict(cls, {**_fields(base), **over})
        if "out" not in over:
            cfg.out = cfg.out + "_quick"
    else:
        cfg = from_dict(cls, over)
    res = study.run(cfg)
    print(json.dumps(study.printed(res, cfg), indent=1, default=str))
    return 0


def _fields(cfg) -> dict:
    import dataclasses

    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
