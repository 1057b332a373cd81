"""`arpo experiment NAME`: controlled end-to-end experiments, one entry of STUDIES each: its module's
config class (whose quick() is the --quick smoke config) and run(), a one-line help, and what the command
prints of its results.

The studies themselves are not part of the installed library: they live in the repository's top-level
experiments/ package (they import the library; the library never imports them), so that the wheel
carries only arpo. `study_module` finds them in the clone arpo runs from (an editable install, or
PYTHONPATH=src), and otherwise says in one line that they need a clone."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from arpo.commands import HELP, POS_INT
from arpo.errors import ArpoError

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


STUDIES_PACKAGE = "experiments"  # the repository's top-level package of studies (not in the wheel)


def clone_root() -> Path | None:
    """The repository arpo is imported from (ROOT/src/arpo), when it has the studies (ROOT/experiments/)."""
    root = Path(__file__).absolute().parents[3]  # ROOT/src/arpo/commands/experiment.py
    return root if (root / STUDIES_PACKAGE / "__init__.py").is_file() else None


def study_module(module: str) -> ModuleType:
    """Import a study's module (experiments.X) from the clone arpo runs from, or say that it needs one."""
    root = clone_root()
    if STUDIES_PACKAGE not in sys.modules and root is not None and str(root) not in sys.path:
        sys.path.insert(0, str(root))  # before any other package of that name (the working directory's)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name not in (STUDIES_PACKAGE, module):  # a study's own missing import: its error
            raise
        raise ArpoError(f"the studies ({module}) are not part of the installed arpo package: run `arpo experiment` "
                        "from a clone of the repository (its experiments/ folder; ./install.sh there)") from None


@dataclass(frozen=True)
class Study:
    """One `arpo experiment NAME`. Its module is imported only when the study is run."""

    help: str  # one line for `arpo experiment --help`
    module: str  # experiments.X (the repository's studies), with run(cfg) -> results
    config: str | None = None  # the config class's name in module; its quick() is the --quick config
    printed: Callable[[dict, Any], dict] = _ratio_summary  # (results, cfg) -> what the command prints
    flags: tuple[str, ...] = ("seeds", "steps", "out", "threads")  # the command's flags the config takes
    command: str | None = None  # instead of config + run: module's function(args) -> exit code (hop2-stats)

    def config_class(self) -> type:
        return getattr(study_module(self.module), str(self.config))

    def quick(self):
        """The smoke-test config (plumbing, not a result), or None where the study has none."""
        quick = getattr(self.config_class(), "quick", None)
        return quick() if quick is not None else None

    def run(self, cfg) -> dict:
        return study_module(self.module).run(cfg)  # looked up now: a test may replace run


STUDIES: dict[str, Study] = {
    "arpo-vs-grpo": Study("ARPO vs GRPO on a generated knowledge-base tool task (docs/experiment_arpo_vs_grpo.md)",
                          "experiments.arpo_vs_grpo", "ExperimentConfig"),
    "svamp-arpo-vs-grpo": Study("ARPO vs GRPO on SVAMP with SmolLM2-135M (docs/experiment_svamp_arpo_vs_grpo.md)",
                                "experiments.svamp", "SvampExperimentConfig"),
    "hop2-arpo-vs-grpo": Study("ARPO vs GRPO (vs AEPO) on hop2, blind: dev, test once (docs/experiment_hop2.md)",
                               "experiments.hop2_study", "Hop2ExperimentConfig", _protocol_summary),
    "hop2-stats": Study("recompute the statistics of a hop2 results.json (--results) and print its tables",
                        "experiments.hop2_stats", command="command"),
    "branching": Study("branch rule settings on fixed models, no training (docs/branching.md)",
                       "experiments.branching", "BranchingConfig", _branching_summary, flags=("out", "threads")),
    "branch-rules": Study("branch rules on hop2 or webhop at equal trajectories and tool calls (docs/branch_rules.md)",
                          "experiments.branch_rules_study", "BranchRulesConfig", _protocol_summary),
}


def register(sub) -> None:
    studies = "\n".join(f"  {n:<20} {st.help}" for n, st in STUDIES.items())
    fields = "; ".join(f"{n}: {st.module}.{st.config}" for n, st in STUDIES.items() if st.config)
    p = sub.add_parser("experiment", help="controlled experiments, e.g. ARPO vs GRPO on a generated tool task",
                       description="Run a controlled experiment end to end with arpo's own pipeline.\nThe studies "
                                   "are the repository's experiments/ package, not part of the installed one: run "
                                   f"them from a clone.\n\nstudies:\n{studies}",
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

    study = STUDIES[args.name]
    if study.command is not None:
        return int(getattr(study_module(study.module), study.command)(args))
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
