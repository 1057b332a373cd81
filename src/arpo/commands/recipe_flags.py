"""Flags and output shared by the recipe commands (`arpo train`, `arpo sft`, `arpo rollout`)."""

from __future__ import annotations

import json
import signal


def add_common(p, *, run_dir: bool = True) -> None:
    p.add_argument("--config", help="YAML config file (default: every field's default; see --print-config)")
    if run_dir:
        p.add_argument("--resume", action="store_true", help="continue RUN_DIR's latest checkpoint exactly "
                       "(changes of model, data, optimizer or algorithm keys are refused)")
        p.add_argument("--trust-pickled-checkpoint", action="store_true",
                       help="--resume a checkpoint of an older arpo whose trainer state (trainer.pt) or in-flight "
                       "trees are pickles: reading a pickle runs any code it holds, so only for runs you wrote")
        p.add_argument("--overwrite", action="store_true", help="start over in a run dir that already has "
                       "checkpoints (the old run is kept aside until the new one writes its first checkpoint)")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (YAML, each field with its meaning) and exit")
    p.add_argument("--json", action="store_true", help="print the summary (or the --print-config) as one JSON line")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. optim.lr=1e-5 rollout.group_size=8")


def _train_memory(cfg) -> bool:
    """A config with train's memory section (sft's has only activation checkpointing: no estimate)."""
    from arpo.settings.train import MemoryConfig

    return isinstance(getattr(cfg, "memory", None), MemoryConfig)


def print_config(cfg, as_json: bool = False) -> int:
    """The resolved config; an algorithm's fields left unset show the preset's values (they used to
    print as null). `as_json`: one JSON object (`--print-config --json`; it printed YAML), with train's
    memory estimate per GPU under `memory_estimate`. A config with a rollout section also lists the
    branch rules `rollout.branch_rule` can name, one line each (comment lines; JSON: `branch_rules`)."""
    import dataclasses

    from arpo.config import explain
    from arpo.settings import rule_lines, rule_summaries

    if getattr(cfg, "lora", None) is not None and hasattr(cfg, "model"):  # null: resolved against model.name
        cfg = dataclasses.replace(cfg, lora=cfg.lora.resolve(cfg.model.name))
    algo = getattr(cfg, "algo", None)
    preset_name = None
    if algo is not None and hasattr(algo, "resolve") and hasattr(cfg, "rollout"):
        preset = algo.resolve()
        unset = {f.name: getattr(preset, f.name) for f in dataclasses.fields(algo)
                 if getattr(algo, f.name) is None and hasattr(preset, f.name)}
        if unset.get("dual_clip", 0) is None:
            unset["dual_clip"] = 0  # the preset has none: 0 is how a config says so
        cfg, preset_name = dataclasses.replace(cfg, algo=dataclasses.replace(algo, **unset)), algo.preset
    if as_json:
        out = dataclasses.asdict(cfg)
        if _train_memory(cfg):  # train: the memory per GPU this config needs (training/memory.py)
            from arpo.training.memory import config_estimate

            est, gpu, what = config_estimate(cfg)
            out["memory_estimate"] = {"assumed": what, "gpu_memory_gib": gpu,
                                      "bytes": None if est is None else {**est.terms, "peak": est.peak}}
        if hasattr(cfg, "rollout"):
            out["branch_rules"] = rule_summaries()
        print(json.dumps(out, default=str))
        return 0
    text = explain(cfg)
    if preset_name is not None:
        text = text.replace("\nalgo:", f"\nalgo:  # the {preset_name} preset's values, except the keys you set", 1)
    print(text)
    if hasattr(cfg, "rollout"):
        lines = [f"#   {x}" for x in rule_lines()]
        print("\n".join(["# branch rules (rollout.branch_rule; docs/branch_rules.md):", *lines]))
    if _train_memory(cfg):  # train: the memory per GPU this config needs (training/memory.py)
        from arpo.training.memory import report

        print(report(cfg))
    return 0


def finish(what: str, out: dict, as_json: bool) -> int:
    """Print the run's summary; the exit code says whether a signal stopped it (130 SIGINT, 143 SIGTERM)."""
    if as_json:
        print(json.dumps(out, default=str))
    else:
        lines = [f"arpo {what}: " + ("stopped early by " + out["stopped_by"] if out.get("stopped_by") else "done")]
        final = out["final"] if isinstance(out.get("final"), dict) else out
        for k, v in final.items():
            if isinstance(v, float):
                lines.append(f"  {k:<24} {v:.4g}")
            elif isinstance(v, (int, str)) and k not in ("stopped_by",):
                lines.append(f"  {k:<24} {v}")
        if isinstance(out.get("final"), dict):
            lines.append(f"  {'checkpoint':<24} {out.get('checkpoint')}")
        print("\n".join(lines))
    sig = out.get("stopped_by")
    return 128 + int(getattr(signal, sig)) if sig else 0
