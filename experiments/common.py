"""What the studies share: the run preamble and record, the RL-run machinery of the studies that train
with `configs/*_rl.yaml` (svamp.py, hop2_study.py, branch_rules_study.py), and the tool-call-ratio analysis.

    start_run        TOKENIZERS_PARALLELISM, torch threads, the output dir
    run_record       wall seconds, load average and provenance, the tail of every results.json
    RLStudyConfig    the fields of an RL study: SFT start, train_config + overrides, eval data and cadence
    train_config     one run's TrainConfig (algo.preset, seeds, run dir; an arm `preset@rule`)
    run_rl           one RL run in segments of eval_every steps, evaluated between segments; checkpoints
                     (reusable_steps) and evaluations (cached_eval) an earlier run left are reused
    summarize        per-method mean curves and the ARPO/GRPO tool-call ratio (arpo_vs_grpo.py's
                     module docstring defines it)
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import arpo.models
from arpo.config import load_config
from arpo.errors import ArpoError, require
from arpo.eval.evaluate import evaluate
from arpo.eval.paired import accuracy_interval, paired
from arpo.provenance import provenance
from arpo.rewards import get_reward_fn
from arpo.runs import write_text_atomic
from arpo.settings import TrainConfig, rule_summaries
from arpo.tools import tools_from_config
from arpo.training.logger import read_metrics
from arpo.training.rundir import unsafe_changes


# ---- every study -------------------------------------------------------------------------------------
def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stop_if_signalled(res: dict) -> dict:
    """A train/sft run that Ctrl-C or SIGTERM stopped (it wrote its checkpoint) ends the whole
    experiment, as the signal asked: KeyboardInterrupt (the CLI: 'interrupted', exit 130). An
    experiment used to go on with its next segment and run after each stop."""
    if res.get("stopped_by"):
        raise KeyboardInterrupt
    return res


def start_run(out: str | Path, threads: int) -> Path:
    """The preamble of a study's run: no tokenizers thread pool (it would fight torch's), `threads` torch
    CPU threads, the output dir made; returns it."""
    import torch  # noqa: PLC0415 - loads torch; kept out of this light module's import

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(threads)
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    ignore = path / ".gitignore"
    if not ignore.exists():
        ignore.write_text(GITIGNORE)
    return path


# OUT/.gitignore: a study's directory may be committed as its runs finish (a machine may not last the
# study); then its checkpoints stay out and its evaluations, metrics, trees and records go in, and a
# later `arpo experiment` on a fresh clone reuses every finished run (reusable_steps, cached_eval)
GITIGNORE = """# written by `arpo experiment`: commit this directory as runs finish; the bulky files stay out
checkpoints/
.overwritten/
.lock
*.safetensors
*.pt
"""


def recorded_settings(cfg: Any) -> dict:
    """A study's config as its results.json records it: `out` relative to the working directory (as
    one types it from the checkout; an absolute path named the folders of the machine that ran it)."""
    settings = dataclasses.asdict(cfg)
    if isinstance(settings.get("out"), str) and Path(settings["out"]).is_absolute():
        settings["out"] = os.path.relpath(settings["out"])
    return settings


def run_record(t0: float) -> dict:
    """The tail of a study's results.json: wall seconds since t0 (time.perf_counter), the load average
    at the end (how shared the machine was) and provenance (code version, packages)."""
    return {"wall_seconds": time.perf_counter() - t0, "load_average_at_end": os.getloadavg(),
            "provenance": provenance()}


def check_methods(methods: list[str], key: str = "methods", arms: bool = False) -> None:
    """The experiments' `methods`: algo presets (algos/presets.py), with `arms` also `preset@rule`
    (train_config: the preset with rollout.branch_rule=rule, a built-in rule or module:function), at
    least one, none twice (`methods=[]` failed after the SFT with an IndexError). ArpoError naming the key."""
    from arpo.algos.presets import PRESETS  # noqa: PLC0415 - loads torch; kept out of this light module's import

    require(isinstance(methods, list) and len(methods) >= 1, key,
            f"needs at least one algo preset, e.g. [arpo,grpo] (got {methods!r})")
    for m in methods:
        preset, _, rule = m.partition("@") if arms else (m, "", "")
        require(preset in PRESETS, key, f"unknown algo preset {preset!r}; valid: {', '.join(sorted(PRESETS))}")
        require(not rule or rule in rule_summaries() or ":" in rule, key,
                f"{m!r}: unknown branch rule {rule!r}; valid: {', '.join(rule_summaries())} or module:function")
    same = [m.rstrip("@") if arms else m for m in methods]  # `arpo@` (no rule) is `arpo`: one arm trained twice
    twice = sorted({m for m in same if same.count(m) > 1})
    require(not twice, key, f"{', '.join(twice)} given twice (`P@` is P); each method once")


# ---- RL studies on a train config --------------------------------------------------------------------
@dataclass
class RLStudyConfig:
    """The settings every RL study on a train config has; a study subclasses it with its defaults (the
    field order, and so the order of results.json's `settings`, is this class's)."""

    out: str = "runs/experiments/rl_study"  # results.json, PNGs, sft/, rl/
    methods: list[str] = field(default_factory=lambda: ["arpo", "grpo"])  # algo presets
    seeds: int = 3  # RL seeds per method (0 .. seeds-1)
    threads: int = 2  # torch CPU threads
    # the SFT start: an existing model (a dir, a run dir), or SFT from sft_config on sft_data
    sft_from: str | None = None
    sft_config: str = "configs/sft_quickstart.yaml"
    sft_data: str = ""  # the study's SFT rows are made from these problems
    sft_overrides: list[str] = field(default_factory=list)  # key=value on sft_config
    # RL: train_config with these overrides; each run sets algo.preset, run.seed, run.dir, steps
    train_config: str = ""
    train_overrides: list[str] = field(default_factory=list)
    steps: int = 30
    # held-out evaluation (greedy), never trained on
    eval_data: str = ""
    eval_every: int = 10
    eval_batch: int = 64
    # also the sampled policy: this many answers per question at the training temperature, beside the
    # greedy one (sampled_accuracy, sampled_format_error_rate in each point; 0: greedy only)
    sampled: int = 0

    def validate(self) -> None:
        for key in ("seeds", "steps", "threads", "eval_every"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        require(self.sampled >= 0, "sampled", f"must be >= 0 (0: greedy only), got {self.sampled}")
        check_methods(self.methods, arms=True)  # train_config runs an arm preset@rule
        # from any directory (it read configs/... from the current one only, and failed after 15 s)
        self.sft_config = repo_file(self.sft_config, "sft_config")
        if self.train_config:
            self.train_config = repo_file(self.train_config, "train_config")


def repo_file(path: str, key: str) -> str:
    """A study's config file: as given, else the arpo checkout's own (`configs/...`, `examples/...`
    relative to the repository root), else an ArpoError naming `key`."""
    p = Path(path).expanduser()
    if p.is_file():
        return str(p)
    root = Path(__file__).resolve().parents[1]  # experiments/common.py -> the checkout
    if not p.is_absolute() and (root / p).is_file():
        return str(root / p)
    raise ArpoError(f"{key}: {path} is not a file, neither from {Path.cwd()} nor from the arpo checkout {root}")


def train_config(cfg: RLStudyConfig, sft_model: str, method: str, seed: int, run_dir: Path):
    preset, _, rule = method.partition("@")  # an arm `preset@rule`: that preset with rollout.branch_rule=rule
    over = list(cfg.train_overrides) + [f"model.name={sft_model}", f"algo.preset={preset}", f"run.seed={seed}",
                                        f"rollout.seed={seed}", f"run.dir={run_dir}", f"run.threads={cfg.threads}",
                                        "run.tensorboard=false", "validation.path=null"]
    over += [f"rollout.branch_rule={rule}"] if rule else []
    tc = load_config(TrainConfig, cfg.train_config, over)
    tc.run.save_every = cfg.eval_every
    tc.run.keep_checkpoints = getattr(cfg, "keep_checkpoints", 1)  # hop2_study.py keeps each eval step's
    return tc


def evaluate_model(model_dir: str, tc, cfg: RLStudyConfig, examples: list[dict]) -> tuple[dict, list]:
    """Greedy held-out metrics and per-question records, with the RL config's agent and template; with
    cfg.sampled = k also the sampled policy's (k answers per question at the training temperature, seed 0):
    `sampled_pass@1` and `sampled_format_error_rate` beside the greedy metrics."""
    from arpo.engine.hf import HFEngine  # noqa: PLC0415 - loads torch; kept out of this light module's import

    model, tok = arpo.models.load_model(model_dir, device="cpu", dtype="float32")
    tools = tools_from_config(tc.tools)
    recs: list = []
    try:
        engine, reward_fn = HFEngine(model, tok), get_reward_fn(tc.reward.fn)
        m = evaluate(engine, tools, tok, examples, reward_fn=reward_fn, agent=tc.agent, temperature=0.0,
                     template=tc.data.template, batch_size=cfg.eval_batch, records_out=recs)
        if cfg.sampled:
            s = evaluate(engine, tools, tok, examples, reward_fn=reward_fn, agent=tc.agent, samples=cfg.sampled,
                         temperature=tc.agent.temperature, template=tc.data.template, batch_size=cfg.eval_batch)
            m.update({"sampled_pass@1": s["pass@1"], "sampled_format_error_rate": s["format_error_rate"],
                      "sampled_k": cfg.sampled})
    finally:
        tools.close()
    return m, recs


def reusable_steps(run_dir: Path, tc, eval_steps: list[int]) -> list[int]:
    """Eval steps whose checkpoint (or its cached evaluation) an earlier run of the same training config
    left in run_dir.

    A run dir is reused only when its config.yaml differs from `tc` in keys that do not change what is
    trained (training/rundir.SAFE_ON_RESUME, run.dir among them): an interrupted experiment, or runs made
    before with `arpo train` on the same config and seed, are evaluated instead of trained again."""
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        return []
    old = yaml.safe_load(saved.read_text()) or {}
    old = relocated(old, (old.get("run") or {}).get("dir"), run_dir)
    tc = dataclasses.replace(tc, lora=tc.lora.resolve(tc.model.name))  # as train.run records it in config.yaml
    if unsafe_changes(old, dataclasses.asdict(tc)):
        return []
    have = []
    for s in eval_steps:
        model = run_dir / "checkpoints" / f"step_{s:06d}" / "model"
        cache = eval_file(run_dir, s)  # evaluated before (its checkpoint may be rotated away)
        if model.is_dir() or (cache.is_file() and same_model(json.loads(cache.read_text()), str(model), cache)):
            have.append(s)
    return have


def relocated(conf: Any, old_dir: str | None, new_dir: Path) -> Any:
    """A run's saved config with the paths under its old place moved to its new one: a study's directory
    cloned elsewhere has run dirs OLD/rl/x -> NEW/rl/x, so a path OLD/... in it (the SFT start's
    model.name) becomes NEW/... . OLD and NEW are what remains of old_dir and new_dir once their common
    tail is cut."""
    if not old_dir:
        return conf
    a, b = list(Path(old_dir).parts), list(new_dir.parts)
    while a and b and a[-1] == b[-1]:
        a.pop()
        b.pop()
    if not a:
        return conf
    old_root, new_root = str(Path(*a)), str(Path(*b)) if b else "."

    def move(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: move(v) for k, v in x.items()}
        if isinstance(x, list):
            return [move(v) for v in x]
        if isinstance(x, str) and (x == old_root or x.startswith(old_root + os.sep)):
            return new_root + x[len(old_root):]
        return x

    return move(conf)


def run_dir_of(out: Path, method: str, seed: int) -> Path:
    """Where a study keeps one RL run: OUT/rl/<method>_seed<seed>."""
    return out / "rl" / f"{method}_seed{seed}"


def eval_file(run_dir: Path, step: int) -> Path:
    """Where cached_eval keeps the evaluation of step `step` in run_dir."""
    return run_dir / f"heldout_step_{step:06d}.json"


def cached_eval(run_dir: Path, step: int, model_dir: str, tc, cfg: RLStudyConfig, examples) -> tuple:
    """evaluate_model, kept as eval_file(run_dir, step) so a rerun does not evaluate twice."""
    path = eval_file(run_dir, step)
    if path.is_file():
        d = json.loads(path.read_text())
        fresh = not cfg.sampled or d.get("metrics", {}).get("sampled_k") == cfg.sampled  # the sampled part too
        if d.get("eval_data") == cfg.eval_data and same_model(d, model_dir, path) and fresh:
            return d["metrics"], d["records"]
    m, recs = evaluate_model(model_dir, tc, cfg, examples)
    write_text_atomic(path, json.dumps({"eval_data": cfg.eval_data, "model": model_dir,
                                        "model_from_here": os.path.relpath(model_dir, path.parent), "metrics": m,
                                        "records": recs}, default=str))
    return m, recs


def same_model(cached: dict, model_dir: str, path: Path) -> bool:
    """Whether an evaluation cached at `path` is of `model_dir`: the same path, or the same path relative
    to the cache file (`model_from_here`), so that a study's directory copied or cloned elsewhere keeps
    its evaluations."""
    return cached.get("model") == model_dir or cached.get("model_from_here") == os.path.relpath(model_dir, path.parent)


def step_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl's training-step rows, the last one of each step (a resumed run may repeat steps)."""
    rows = {r["step"]: r for r in read_metrics(run_dir) if "step" in r and "reward_mean" in r}
    return [rows[k] for k in sorted(rows)]


def run_rl(cfg: RLStudyConfig, method: str, seed: int, sft_model: str, examples, start: dict,
           out: Path, on_end: Callable[[Path, Any], None] | None = None) -> dict:
    """One RL run in segments of eval_every steps, evaluated between segments. Checkpoints an earlier
    run of the same config left in the run dir are evaluated, not trained again (reusable_steps).
    on_end(run_dir, train_config): called once the last segment is evaluated (e.g. a test evaluation
    while the last checkpoint is there)."""
    from arpo.recipes import train  # noqa: PLC0415 - loads torch+numpy; kept out of this light module's import

    run_dir = run_dir_of(out, method, seed)
    tc = train_config(cfg, sft_model, method, seed, run_dir)
    ends = list(range(cfg.eval_every, cfg.steps + 1, cfg.eval_every))
    have = reusable_steps(run_dir, tc, ends)
    gap = have != ends[:len(have)]  # a later step kept and an earlier one not
    stuck = len(have) < len(ends) and not (run_dir / "checkpoints" / f"step_{have[-1]:06d}").is_dir() if have else False
    if have and (gap or stuck):
        # evaluations kept without the checkpoint to continue from (a copy of the run's small files on
        # another machine): training starts over; the same seed trains the same weights
        log(f"{method} seed {seed}: steps {have} are evaluated but step {have[-1]}'s checkpoint is gone; "
            "training again from the start")
        have = []
    if not have:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        log(f"{method} seed {seed}: reusing the checkpoints of steps {have} in {run_dir}")
    curve = [{"step": 0, "tool_calls": 0, **start["point"], "seconds": 0.0}]
    t0, recs = time.perf_counter(), start["records"]
    for end in ends:
        ckpt = run_dir / "checkpoints" / f"step_{end:06d}"
        if end not in have:
            tc.steps = end
            res = stop_if_signalled(train.run(tc, resume=(run_dir / "checkpoints").is_dir(), quiet=True))
            ckpt = Path(res["checkpoint"])
        m, recs = cached_eval(run_dir, end, str(ckpt / "model"), tc, cfg, examples)
        rows = [r for r in step_rows(run_dir) if r["step"] <= end]
        calls = sum(r.get("tool_calls_issued", 0) for r in rows)
        curve.append({"step": end, "tool_calls": calls, **point(m, recs), "seconds": time.perf_counter() - t0})
        log(f"{method} seed {seed} step {end}: held-out {m['pass@1']:.3f}  cumulative tool calls {calls}  "
            f"train reward {rows[-1].get('reward_mean', float('nan')) if rows else float('nan'):.3f}")
    if on_end is not None:
        on_end(run_dir, tc)
    keys = ("reward_mean", "accuracy", "format_error_rate", "tool_calls_per_traj", "tool_calls_issued", "branches",
            "branch_decisions", "branch_rate", "delta_entropy", "trajectories", "response_length", "step_seconds",
            "initial_entropy", "post_tool_entropy")
    per_step = [{"step": r["step"], **{k: r[k] for k in keys if k in r}} for r in step_rows(run_dir)
                if r["step"] <= cfg.steps]
    return {"method": method, "seed": seed, "curve": curve, "per_step": per_step, "reused_steps": have,
            "final_vs_sft": {k: v for k, v in paired(start["records"], recs).items() if not k.endswith("_ids")},
            "final_interval": accuracy_interval(recs),
            "branches_total": sum(r.get("branches", 0) for r in per_step),
            "trajectories_total": sum(r.get("trajectories", 0) for r in per_step),
            "seconds": time.perf_counter() - t0}


def point(metrics: dict, recs: list) -> dict:
    """A curve point from evaluate_model: accuracy with its interval over questions, format errors,
    tool calls per answer, response tokens."""
    ci = accuracy_interval(recs)
    out = {"accuracy": metrics["pass@1"], "ci_low": ci["ci_low"], "ci_high": ci["ci_high"],
           "format_error_rate": metrics["format_error_rate"], "tool_calls_per_answer": metrics["tool_calls"],
           "response_tokens": metrics["response_tokens"]}
    if "sampled_pass@1" in metrics:  # RLStudyConfig.sampled: the sampled policy beside the greedy one
        out.update(sampled_accuracy=metrics["sampled_pass@1"],
                   sampled_format_error_rate=metrics["sampled_format_error_rate"])
    return out


# ---- the tool-call-ratio analysis --------------------------------------------------------------------
def calls_to_reach(calls: list[float], accs: list[float], target: float) -> float | None:
    """Tool calls at which the curve first reaches `target` (linear interpolation), None if never."""
    for i, a in enumerate(accs):
        if a >= target - 1e-12:
            if i == 0:
                return float(calls[0])
            a0, c0, c1 = accs[i - 1], calls[i - 1], calls[i]
            return float(c0 + (c1 - c0) * (target - a0) / (a - a0))
    return None


def mean_curve(runs: list[dict]) -> dict:
    """Seed mean / std / min / max of accuracy and mean cumulative calls at each evaluation step (std:
    the sample sd, ddof 1, over seeds; 0 for one seed)."""

    def sd(xs: list[float]) -> float:
        return statistics.stdev(xs) if len(xs) > 1 else 0.0

    n = min(len(r["curve"]) for r in runs)
    keys = ("step", "accuracy_mean", "accuracy_std", "accuracy_min", "accuracy_max", "tool_calls_mean",
            "tool_calls_std", "heldout_accuracy_mean", "heldout_accuracy_std")
    out: dict[str, list[float | None]] = {k: [] for k in keys}  # held-out: None where no run measured it
    for i in range(n):
        accs = [r["curve"][i]["accuracy"] for r in runs]
        calls = [r["curve"][i]["tool_calls"] for r in runs]
        out["step"].append(runs[0]["curve"][i]["step"])
        out["accuracy_mean"].append(statistics.fmean(accs))
        out["accuracy_std"].append(sd(accs))
        out["accuracy_min"].append(min(accs))
        out["accuracy_max"].append(max(accs))
        out["tool_calls_mean"].append(statistics.fmean(calls))
        out["tool_calls_std"].append(sd(calls))
        held = [r["curve"][i]["heldout_accuracy"] for r in runs if "heldout_accuracy" in r["curve"][i]]
        out["heldout_accuracy_mean"].append(statistics.fmean(held) if held else None)
        out["heldout_accuracy_std"].append(sd(held) if held else None)
    return out


def summarize(runs: dict[str, list[dict]], start_acc: float, a: str = "arpo", b: str = "grpo") -> dict:
    """Per-method mean curves and the tool-call ratio a/b at the common target accuracy."""
    curves = {m: mean_curve(rs) for m, rs in runs.items()}
    s: dict[str, Any] = {"curves": curves, "start_accuracy": start_acc}
    for m, c in curves.items():
        s[m] = {"final_accuracy_mean": c["accuracy_mean"][-1], "final_accuracy_std": c["accuracy_std"][-1],
                "final_heldout_accuracy_mean": c["heldout_accuracy_mean"][-1],
                "best_accuracy_mean": max(c["accuracy_mean"]), "total_tool_calls_mean": c["tool_calls_mean"][-1],
                "tool_calls_per_step_mean": c["tool_calls_mean"][-1] / max(1, c["step"][-1])}
    if a not in curves or b not in curves:
        return s
    ca, cb = curves[a], curves[b]
    target = min(max(ca["accuracy_mean"]), max(cb["accuracy_mean"]))
    s["per_step_tool_call_ratio"] = s[a]["total_tool_calls_mean"] / max(1e-9, s[b]["total_tool_calls_mean"])
    levels = {}
    for frac in (0.25, 0.5, 0.75, 1.0):
        x = start_acc + frac * (target - start_acc)
        na = calls_to_reach(ca["tool_calls_mean"], ca["accuracy_mean"], x)
        nb = calls_to_reach(cb["tool_calls_mean"], cb["accuracy_mean"], x)
        levels[f"{frac:.2f}"] = {"accuracy": x, f"calls_{a}": na, f"calls_{b}": nb,
                                 "ratio": na / nb if na is not None and nb else None}
    s["target_accuracy"] = target
    s["improvement_over_sft"] = target - start_acc
    s["ratio_levels"] = levels
    s["tool_call_ratio"] = levels["1.00"]["ratio"] if target > start_acc + 1e-9 else None
    pairs = []
    for ra, rb in zip(runs[a], runs[b], strict=True):
        acc_a = [p["accuracy"] for p in ra["curve"]]
        acc_b = [p["accuracy"] for p in rb["curve"]]
        x = min(max(acc_a), max(acc_b))
        na = calls_to_reach([p["tool_calls"] for p in ra["curve"]], acc_a, x)
        nb = calls_to_reach([p["tool_calls"] for p in rb["curve"]], acc_b, x)
        pairs.append({"seed": ra["seed"], "target_accuracy": x, f"calls_{a}": na, f"calls_{b}": nb,
                      "ratio": na / nb if (na is not None and nb and x > start_acc + 1e-9) else None})
    s["per_seed_ratio"] = pairs
    return s
