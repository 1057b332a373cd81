"""ARPO vs GRPO (and AEPO) on hop2 (data/hop2.py), the SmolLM2-135M, under the blind protocol.

    arpo experiment hop2-arpo-vs-grpo [--seeds 3] [--steps 20] [--out DIR] [report_test=true]

The pipeline (common.py's RL runs, as svamp.py's, on hop2's data, tool and template):

    scripted two-lookup trajectories of hop2:train[0:sft_n] through the real `lookup` tool
      ─► SFT of the embedded SmolLM2-135M (sft_config) ─► for seed, for method: RL on
         hop2:train[sft_n:] (train_config, identical but for algo.preset and the seed), every
         `eval_every` steps greedy accuracy on **dev** (common.run_rl: exact resumes, cached evaluations)
      ─► selection on dev, per method: the eval step with the best seed-mean dev accuracy (ties: the
         earlier step) ─► results.json: dev statistics (blind_protocol.py: bootstrap intervals over questions,
         sample sd over seeds, paired wins / losses between arms, the training tool-call ratio with a
         bootstrap interval over RL steps), per-question correctness per seed, and the `statistics`
         section (hop2_stats.py: intervals over seeds and question clusters, seed-level tests, the
         tool-call ratio over seeds and steps, calls to reach an accuracy), recomputable from the file
      ─► only with report_test=true: the selection is frozen in OUT/protocol.json and the selected
         checkpoints are evaluated on **test** once; a rerun that would select differently is refused.

Every number in results.json sits under `dev` or `test`, and OUT/protocol.json lists each with its split.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from arpo.analysis import branches
from arpo.config import load_config
from arpo.data.datasets import load_examples
from arpo.errors import ArpoError
from arpo.provenance import AVX2_ENV, cpu_state
from arpo.settings import SFTConfig
from arpo.sft.convert import hop2_sft_rows
from arpo.training.rollout_log import read_run_trees
from arpo.training.rundir import unsafe_changes
from experiments import blind_protocol as P
from experiments import common, hop2_figures, hop2_report, hop2_stats
from experiments.common import log


# ---- the experiment ------------------------------------------------------------------------------
@dataclass
class Hop2ExperimentConfig(common.RLStudyConfig):
    out: str = "runs/experiments/hop2_arpo_vs_grpo"
    methods: list[str] = field(default_factory=lambda: ["arpo", "grpo"])  # e.g. [arpo,grpo,aepo]
    sft_config: str = "configs/sft_quickstart.yaml"
    sft_data: str = "hop2:train[0:120]"  # scripted trajectories of these questions
    # 8 steps (dev 0.583; 3 steps 0.467, 5 steps 0.317, 30 steps ≈ 0.98 of training rollouts: nothing left to learn)
    sft_overrides: list[str] = field(default_factory=lambda: ["steps=8", "prompts_per_step=8", "optim.lr=1e-4"])
    train_config: str = "configs/hop2_rl.yaml"  # RL on hop2:train[120:240]
    steps: int = 10
    eval_every: int = 5
    eval_data: str = "hop2:dev"  # the selection split (every curve point)
    test_data: str = "hop2:test"  # evaluated once, after the selection is frozen (report_test=true)
    report_test: bool = False
    # the step whose checkpoint is tested: dev = per method the eval step with the best seed-mean dev
    # accuracy, chosen after every run (its checkpoints must still be there); last = the last step, fixed
    # before any result, so that with report_test=true each run's test is evaluated as the run ends and
    # nothing waits on checkpoints a machine may lose (an experiment spread over several machines)
    select: str = "dev"
    keep_checkpoints: int = 100  # every eval step's checkpoint stays, so the selected one can be tested
    bootstrap_resamples: int = 2000
    bootstrap_seed: int = 0
    level: float = 0.95

    @classmethod
    def quick(cls, **over) -> Hop2ExperimentConfig:
        """A smoke-test size on the tiny random model (plumbing, not a result)."""
        base: dict[str, Any] = dict(
            seeds=1, sft_data="hop2:train[0:8]", eval_data="hop2:dev[0:4]", test_data="hop2:test[0:4]", steps=2,
            eval_every=2,
            sft_overrides=["model.name=tiny-random", "steps=2", "prompts_per_step=4", "data.max_seq_len=4096"],
            train_overrides=["prompts_per_step=2", "rollout.group_size=4", "rollout.initial_rollouts=2",
                             "agent.max_response_tokens=24", "rollout.branch_threshold=0.0"])
        base.update(over)
        return cls(**base)


SFT_RECORD = "sft.json"  # OUT/sft.json: the SFT config, its data's sha256 and its result, for reuse


SftRows = Callable[[], tuple[str, list[dict]]]  # () -> (file name in OUT, SFT rows): another task's trajectories


def make_sft(cfg: Hop2ExperimentConfig, out: Path, make_rows: SftRows | None = None) -> dict:
    """SFT on the scripted trajectories (hop2's of cfg.sft_data, or make_rows') into OUT/sft, or the SFT
    model an earlier command in OUT trained with the same config on the same rows (OUT/sft.json; its
    result comes back with reused: true), so that `report_test=true` evaluates the checkpoints of the
    SFT start they were trained from."""
    from arpo.recipes.sft import run as sft_run  # noqa: PLC0415 - loads torch; kept out of this light module's import

    name, rows = make_rows() if make_rows else ("sft_hop2.jsonl", hop2_sft_rows(load_examples(cfg.sft_data)))
    path = out / name
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text)
    over = list(cfg.sft_overrides) + [f"data.path=[{path}]", f"run.dir={out / 'sft'}", f"run.threads={cfg.threads}",
                                      "run.tensorboard=false"]
    sc = load_config(SFTConfig, cfg.sft_config, over)
    conf = yaml.safe_load(yaml.safe_dump(dataclasses.asdict(sc)))
    sha = hashlib.sha256(text.encode()).hexdigest()
    record = out / SFT_RECORD
    old: dict = {}
    if record.is_file():
        old = json.loads(record.read_text())
        if old.get("data_sha256") != sha or unsafe_changes(old.get("config") or {}, conf):
            old = {}
        elif Path(old["result"]["model"]).is_dir():
            return {**old["result"], "reused": True}
    t0 = time.perf_counter()
    res = common.stop_if_signalled(sft_run(sc, overwrite=True, quiet=True))  # a stopped SFT is no start
    result = {"model": res["model"], "rows": len(rows), "steps": res["steps"], "final_loss": res["final_loss"],
              "seconds": time.perf_counter() - t0, "weights_sha256": weights_sha256(Path(res["model"])),
              "cpu": cpu_state()}
    kept = old.get("result", {}).get("weights_sha256")
    if kept and kept != result["weights_sha256"]:  # OUT kept from another machine: its runs start from `kept`
        raise ArpoError(sft_mismatch(record, old["result"], result))
    record.write_text(json.dumps({"config": conf, "data_sha256": sha, "result": result}, indent=1, default=str))
    return result


def sft_mismatch(record: Path, kept: dict, here: dict) -> str:
    """The error for an SFT model trained again with other weights than `kept` (OUT/sft.json's result):
    the two sha256, the CPU instructions each was made with (cpu_state; 'not recorded' in a record
    older than that field) and what to do about it."""
    def cpu(r: dict) -> str:
        c = r.get("cpu")
        if not c:
            return "not recorded"
        env = " ".join(f"{k}={v}" for k, v in c["isa_env"].items())
        return (c["capability"] or "unknown") + (f" with {env}" if env else "")

    avx2 = " ".join(f"{k}={v}" for k, v in AVX2_ENV.items())
    return (f"{record}: the SFT model trained again here differs from the one this directory's runs started "
            f"from (weights sha256 {here['weights_sha256'][:12]} != {kept['weights_sha256'][:12]}; CPU kernels "
            f"here {cpu(here)}, there {cpu(kept)}), so new runs would not be comparable with the kept ones. The "
            "same torch build on a CPU with other vector instructions computes other floats: on an AVX-512 "
            f"machine `{avx2}` in the environment reproduced an AVX2 machine's weights; otherwise use a new --out")


def weights_sha256(model_dir: Path) -> str:
    """sha256 over a model dir's weight files (*.safetensors, by name): equal weights, equal hash."""
    h = hashlib.sha256()
    for f in sorted(model_dir.glob("*.safetensors")):
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def sft_start(cfg: Hop2ExperimentConfig, out: Path, make_rows: SftRows | None = None) -> dict:
    """The RL runs' start: sft_from as given, or make_sft's model (logged)."""
    if cfg.sft_from:
        return {"model": cfg.sft_from, "reused": True}
    sft = make_sft(cfg, out, make_rows)
    log(f"SFT{' (reused)' if sft.get('reused') else ''}: {sft['rows']} scripted rows, {sft['steps']} steps, "
        f"loss {sft['final_loss']:.3f} ({sft['seconds']:.0f} s) -> {sft['model']}")
    return sft


def select_steps(runs: dict[str, list[dict]], how: str = "dev", last: int | None = None) -> dict[str, int]:
    """Per method, the eval step (> 0) with the highest seed-mean dev accuracy; ties: the earlier step.
    how=last: every method's `last` step (the pre-registered choice of select=last)."""
    if how == "last":
        return {m: int(last or 0) for m in runs}
    out = {}
    for m, rs in runs.items():
        n = min(len(r["curve"]) for r in rs)
        best = max(range(1, n), key=lambda i: (statistics.fmean(r["curve"][i]["accuracy"] for r in rs), -i))
        out[m] = rs[0]["curve"][best]["step"]
    return out


def question_scores(per_seed_records: list[list[dict]]) -> dict[str, float]:
    """Per question: its correctness averaged over seeds (one greedy record per question per seed)."""
    by: dict[str, list[float]] = {}
    for recs in per_seed_records:
        for r in recs:
            by.setdefault(r["example_id"], []).append(float(r["correct"]))
    return {q: statistics.fmean(v) for q, v in sorted(by.items())}


def split_stats(records: dict[str, list[list[dict]]], cfg: Hop2ExperimentConfig,
                clusters: dict[str, str] | None = None) -> dict:
    """Per method: per-seed accuracy, seed mean and sample sd, bootstrap interval over questions;
    between arms (each vs the last method, e.g. grpo): paired wins / losses per question; and
    `per_question` (hop2_stats.per_question: correctness per seed and question, with each question's
    cluster) for the seed- and cluster-aware statistics (results["statistics"], hop2_stats.py)."""
    out: dict[str, Any] = {}
    scores = {m: question_scores(rs) for m, rs in records.items()}
    for m, rs in records.items():
        accs = [statistics.fmean(float(r["correct"]) for r in recs) for recs in rs]
        calls = [sum(r["tool_calls"].values()) for recs in rs for r in recs]
        boot = P.bootstrap_mean_ci(list(scores[m].values()), cfg.bootstrap_resamples, cfg.level, cfg.bootstrap_seed)
        out[m] = {"accuracy_per_seed": accs, "accuracy_mean": statistics.fmean(accs),
                  "accuracy_sd": P.sample_sd(accs), "bootstrap": {**boot, "resampled": hop2_stats.QUESTION_BOOTSTRAP},
                  "tool_calls_per_question": statistics.fmean(calls)}
    base = list(records)[-1]
    out["paired"] = {f"{m}_vs_{base}": {**P.paired_counts([scores[m][q] for q in scores[base]],
                                                          [scores[base][q] for q in scores[base]]),
                                        "unit": hop2_stats.QUESTION_PAIRED}
                     for m in records if m != base}
    out["per_question"] = hop2_stats.per_question(records, clusters or {})
    return out


def tool_call_ratio(runs: dict[str, list[dict]], cfg: Hop2ExperimentConfig) -> dict:
    """Training tool calls of each arm vs the last (e.g. grpo): Σ over steps of the calls issued (summed
    over seeds), with a bootstrap interval over RL steps (paired: step t has the same prompts in both)."""
    base = list(runs)[-1]

    def per_step(rs):
        n = min(len(r["per_step"]) for r in rs)
        return [sum(r["per_step"][i].get("tool_calls_issued", 0) for r in rs) for i in range(n)]

    out = {}
    for m in runs:
        if m != base:
            a, b = per_step(runs[m]), per_step(runs[base])
            n = min(len(a), len(b))
            out[f"{m}/{base}"] = (P.bootstrap_ratio_ci(a[:n], b[:n], cfg.bootstrap_resamples, cfg.level,
                                                       cfg.bootstrap_seed) if n and sum(b[:n]) else None)
    return out


def open_ledger(cfg: Hop2ExperimentConfig, out: Path) -> P.Ledger:
    """OUT/protocol.json, refusing a second test report under other settings. select=last: the choice
    exists before any result, so it is frozen here (each run then tests as it ends)."""
    ledger = P.Ledger(out / "protocol.json")
    done = ledger.frozen if ledger.data.get("test_reported_for") else None
    if cfg.report_test and done is not None and done["selection"]["settings"] != _frozen_settings(cfg):
        raise ArpoError(f"{ledger.path}: test was already reported in this directory with other settings; a test "
                        "split is reported once. Use a new --out to experiment further (on dev).")
    if cfg.select not in ("dev", "last"):
        raise ArpoError(f"select: {cfg.select!r}; choose dev or last")
    if cfg.report_test and cfg.select == "last":
        ledger.freeze({"steps": select_steps({m: [] for m in cfg.methods}, "last", cfg.steps),
                       "settings": _frozen_settings(cfg)}, reason="pre-registered: the last step (select=last)")
    return ledger


def run(cfg: Hop2ExperimentConfig, make_rows: SftRows | None = None) -> dict:
    """The experiment (module docstring); make_rows: the SFT rows of another task (default: hop2's)."""
    out = common.start_run(cfg.out, cfg.threads)
    ledger = open_ledger(cfg, out)
    test_cfg = dataclasses.replace(cfg, eval_data=cfg.test_data)
    test_as_runs_end = cfg.report_test and cfg.select == "last"
    t0 = time.perf_counter()
    sft = sft_start(cfg, out, make_rows)
    dev = load_examples(cfg.eval_data)
    tc0 = common.train_config(cfg, sft["model"], cfg.methods[0], 0, out / "rl" / "_")
    m0, recs0 = common.cached_eval(out, 0, sft["model"], tc0, cfg, dev)
    start = {"point": common.point(m0, recs0), "records": recs0}
    log(f"SFT start: dev {m0['pass@1']:.3f} on {len(dev)} questions")
    runs: dict[str, list[dict]] = {mt: [] for mt in cfg.methods}
    cache: dict[str, list] = {}

    def examples(c):
        return cache.setdefault(c.eval_data, load_examples(c.eval_data))

    def test_now(mt: str, seed: int):
        def run_test(run_dir: Path, tc) -> None:
            model = run_dir / "checkpoints" / f"step_{cfg.steps:06d}" / "model"
            (run_dir / "test_eval").mkdir(parents=True, exist_ok=True)
            common.cached_eval(run_dir / "test_eval", cfg.steps, str(model), tc, test_cfg, examples(test_cfg))
        return run_test if test_as_runs_end else None

    for seed in range(cfg.seeds):  # interleaved: a cut-short run still has every method
        for mt in cfg.methods:
            runs[mt].append(common.run_rl(cfg, mt, seed, sft["model"], dev, start, out, on_end=test_now(mt, seed)))
    selection = select_steps(runs, cfg.select, cfg.steps)

    def records(split_cfg, step_of) -> dict[str, list[list[dict]]]:
        got: dict[str, list[list[dict]]] = {}
        for mt in cfg.methods:
            got[mt] = []
            for seed in range(cfg.seeds):
                run_dir = common.run_dir_of(out, mt, seed)
                model = run_dir / "checkpoints" / f"step_{step_of[mt]:06d}" / "model"
                tc = common.train_config(split_cfg, sft["model"], mt, seed, run_dir)
                where = run_dir if split_cfg.eval_data == cfg.eval_data else run_dir / "test_eval"
                where.mkdir(parents=True, exist_ok=True)
                got[mt].append(common.cached_eval(where, step_of[mt], str(model), tc, split_cfg,
                                                  examples(split_cfg))[1])
        return got

    def clusters(c) -> dict[str, str]:  # hop2: first-hop town / relation; webhop: the two pages
        return {ex["id"]: hop2_stats.question_cluster(ex) for ex in examples(c)}

    dev_stats = split_stats(records(cfg, selection), cfg, clusters(cfg))
    dev_stats["tool_call_ratio"] = tool_call_ratio(runs, cfg)
    dev_stats["selected_steps"] = selection
    for mt in cfg.methods:
        ledger.record(f"{mt}/accuracy_at_selected_step", dev_stats[mt]["accuracy_mean"], "dev",
                      step=selection[mt], data=cfg.eval_data)
    branching = branching_study(out, cfg)
    results: dict[str, Any] = {"settings": common.recorded_settings(cfg), "sft": sft, "start_dev": start["point"],
                               "runs": runs, "summary": common.summarize(runs, start["point"]["accuracy"])
                               if len(cfg.methods) >= 2 and {"arpo", "grpo"} <= set(cfg.methods) else {},
                               "dev": dev_stats, "branching": branching}
    if cfg.report_test:
        if not test_as_runs_end:
            ledger.freeze({"steps": selection, "settings": _frozen_settings(cfg)},
                          reason="best seed-mean dev accuracy")
        test_stats = split_stats(records(test_cfg, selection), cfg, clusters(test_cfg))
        for mt in cfg.methods:
            ledger.record(f"{mt}/accuracy", test_stats[mt]["accuracy_mean"], "test", step=selection[mt],
                          data=cfg.test_data)
        results["test"] = test_stats
        log(f"test ({cfg.test_data}, reported once for steps {selection}): "
            + ", ".join(f"{mt} {test_stats[mt]['accuracy_mean']:.3f}" for mt in cfg.methods))
    else:
        results["test"] = None
        log(f"test not evaluated: selection on dev is {selection}; rerun with report_test=true to freeze it and "
            f"report {cfg.test_data} once")
    results["statistics"] = hop2_stats.statistics(results)
    results.update(common.run_record(t0))  # wall_seconds, load_average_at_end, provenance
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "report.md").write_text(hop2_report.report(results))
    results["figures"] = [str(p) for p in hop2_figures.plot(results, out)]
    return results


def branching_study(out: Path, cfg: Hop2ExperimentConfig) -> dict:
    """analysis/branches.py on the trees every RL run kept: per method, per seed and pooled over seeds
    (all training steps up to cfg.steps)."""
    res: dict[str, Any] = {}
    for mt in cfg.methods:
        per_seed, pooled = [], []
        for seed in range(cfg.seeds):
            trees = [t for t in read_run_trees(common.run_dir_of(out, mt, seed)) if t["step"] <= cfg.steps]
            per_seed.append(branches.study(trees))
            pooled += trees
        res[mt] = {"per_seed": per_seed, "pooled": branches.study(pooled)}
    return res


def _frozen_settings(cfg: Hop2ExperimentConfig) -> dict:
    """The settings that define what was selected (not where it is written or how it is reported)."""
    skip = {"out", "report_test", "threads", "eval_batch", "sampled"}  # sampled: reported, never selected on
    return json.loads(json.dumps({k: v for k, v in dataclasses.asdict(cfg).items() if k not in skip}, default=str))
