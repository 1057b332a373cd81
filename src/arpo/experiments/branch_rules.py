"""Branch rules compared under the blind protocol, at equal trajectories and at equal executed tool
calls (issue 41; docs/branch_rules.md):

    arpo experiment branch-rules [--seeds 5] [--steps 20] [--out DIR] [report_test=true]
    arpo experiment branch-rules task=webhop [--seeds 5] [--steps 6] [--out DIR] [report_test=true]

It is hop2's experiment (experiments/hop2.py: SFT, RL per seed and arm, dev curves, the step chosen
on dev, test once through protocol.Ledger, the seed- and cluster-aware `statistics` of hop2_stats.py,
calls to reach an accuracy, and analysis/branches.py's branch placement and outcome changes per arm)
with arms `preset@rule`: the preset with `rollout.branch_rule: rule` (experiments/common.train_config).
Every arm has the same M trajectories per prompt and the same prompts at each step (same seeds).
The last arm is the base of every comparison (default: arpo, the paper's rule).

Budget-matched: each arm spends a different number of executed tool calls per step (prefix sharing,
AEPO's probe), so next to "accuracy at the dev-selected step" the results hold `matched_calls`:
each run's dev accuracy at the same cumulative executed training calls C, linearly interpolated
between its evaluations (accuracy_at), for C = f·C_max, C_max = the calls every run reached (the
smallest final cumulative count over all runs, so nothing is extrapolated), f in budget_fractions;
per C the seed-level tests against the base (clustered.seed_level) and a seed bootstrap. Training is
not cut short at C: every arm trains the same steps, and the comparison reads the curves at C.
One run that stops calling tools sets C_max for all (a collapse: then every curve is read early), so
`matched_calls_per_pair` also reads each arm against the base seed pair by seed pair, at the pair's
own largest common budget (pair_matched_calls; added after the hop2 study's first seeds showed it).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arpo.errors import ArpoError
from arpo.experiments import clustered as C
from arpo.experiments import hop2
from arpo.experiments import protocol as P
from arpo.experiments.hop2_report import _ci, _f, _p
from arpo.experiments.hop2_stats import bootstrap_opts

# what task=webhop changes (where the setting still has hop2's value): examples/deep_search's SFT
# (scripted trajectories of webhop:train[0:120] through the real tools; sft.yaml as it is) and RL
# (train.yaml), on a web this experiment serves (`arpo web serve --corpus webhop:pages`, WEB_CORPUS)
WEBHOP = {"train_config": "examples/deep_search/train.yaml", "eval_data": "webhop:dev", "test_data": "webhop:test",
          "sft_config": "examples/deep_search/sft.yaml", "sft_data": "webhop:train[0:120]", "sft_overrides": []}
WEB_CORPUS = "webhop:pages"


@dataclass
class BranchRulesConfig(hop2.Hop2ExperimentConfig):
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
        base = {k: getattr(hop2.Hop2ExperimentConfig.quick(), k) for k in
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


def accuracy_at(curve: list[dict], calls: float) -> float:
    """Accuracy at `calls` cumulative executed training calls on a run's curve [(c_0, a_0), ...] (c
    non-decreasing): a_i + (a_{i+1} − a_i)·(calls − c_i)/(c_{i+1} − c_i) for c_i ≤ calls ≤ c_{i+1}
    (the first such segment; a flat stretch c_i = c_{i+1} = calls gives a_i). Outside [c_0, c_last]: an error."""
    pts = [(float(p["tool_calls"]), float(p["accuracy"])) for p in curve]
    for (c0, a0), (c1, a1) in zip(pts, pts[1:], strict=False):
        if c0 <= calls <= c1:
            return a0 if c1 == c0 else a0 + (a1 - a0) * (calls - c0) / (c1 - c0)
    if pts and calls == pts[0][0]:
        return pts[0][1]
    raise ValueError(f"{calls} calls lie outside the curve's [{pts[0][0]}, {pts[-1][0]}]")


def matched_calls(runs: dict[str, list[dict]], fractions: list[float], opts: dict) -> dict:
    """Per budget C = f·C_max (module docstring): each run's accuracy at C, the arm's mean and seed
    bootstrap, and each arm against the base (the last) with clustered.seed_level."""
    methods = list(runs)
    base = methods[-1]
    c_max = min(float(r["curve"][-1]["tool_calls"]) for rs in runs.values() for r in rs)
    out: dict[str, Any] = {"c_max": c_max, "base": base, "levels": [],
                           "how": "each run's dev curve against cumulative executed training tool calls, linearly "
                                  "interpolated at C = f·c_max; c_max = the smallest final count over all runs"}
    for f in fractions:
        c = f * c_max
        accs = {m: [accuracy_at(r["curve"], c) for r in rs] for m, rs in runs.items()}
        out["levels"].append({
            "fraction": f, "calls": c,
            "arms": {m: {"accuracy_per_seed": a, "accuracy_mean": statistics.fmean(a),
                         "seed_bootstrap": {**C.crossed_bootstrap_mean([[x] for x in a], ["all"], **opts),
                                            "resampled": "seeds only (each run's interpolated accuracy)"}}
                     for m, a in accs.items()},
            "vs_base": {f"{m}_vs_{base}": C.seed_level(accs[m], accs[base]) for m in methods if m != base}})
    return out


def matched_calls_table(mc: dict) -> str:
    """Markdown: per budget C, each arm's mean dev accuracy at C (seed bootstrap) and, against the base,
    the mean difference with the sign-flip p over seeds (the permutation p where seeds are unpaired)."""
    arms = list(mc["levels"][0]["arms"]) if mc["levels"] else []
    lines = ["| calls (f · C_max) | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for lv in mc["levels"]:
        cells = []
        for m in arms:
            a, vs = lv["arms"][m], lv["vs_base"].get(f"{m}_vs_{mc['base']}")
            cell = f"{_f(a['accuracy_mean'])} {_ci(a['seed_bootstrap'])}"
            if vs:
                cell += f"; Δ {_f(vs['diff'], sign=True)}, p {_p(vs.get('p_sign_flip', vs['p_permutation']))}"
            cells.append(cell)
        lines.append(f"| {_f(lv['calls'], 0)} ({lv['fraction']:g}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pair_matched_calls(runs: dict[str, list[dict]], opts: dict) -> dict:
    """Each arm against the base (the last), seed pair by seed pair (run s of each trains on the same
    prompts): both runs' dev accuracy at C_s = min(final calls of the two), the largest budget both
    reached, so nothing is extrapolated and a run that stopped calling tools caps its own pair only
    (matched_calls' single C_max is the smallest final count of all runs). Per arm: the C_s, each
    run's accuracy at C_s, the differences d_s = a_s − b_s with clustered.seed_level's tests and their
    seed bootstrap."""
    methods = list(runs)
    base = methods[-1]
    out: dict[str, Any] = {"base": base, "arms": {},
                           "how": "per seed pair s: both runs' dev curves (linear in cumulative executed training "
                                  "tool calls) read at C_s = the smaller of the two final counts"}
    for m in methods[:-1]:
        calls = [min(float(a["curve"][-1]["tool_calls"]), float(b["curve"][-1]["tool_calls"]))
                 for a, b in zip(runs[m], runs[base], strict=True)]
        acc = [accuracy_at(r["curve"], c) for r, c in zip(runs[m], calls, strict=True)]
        acc_base = [accuracy_at(r["curve"], c) for r, c in zip(runs[base], calls, strict=True)]
        diffs = [a - b for a, b in zip(acc, acc_base, strict=True)]
        out["arms"][m] = {"calls_per_seed": calls, "accuracy_per_seed": acc, "base_accuracy_per_seed": acc_base,
                          "vs_base": C.seed_level(acc, acc_base),
                          "diff_seed_bootstrap": {**C.crossed_bootstrap_mean([[d] for d in diffs], ["all"], **opts),
                                                  "resampled": "seed pairs (each pair's difference)"}}
    return out


def pair_matched_calls_table(pm: dict) -> str:
    """Markdown: per arm, each seed pair's budget C_s and the two accuracies at it, the mean difference
    with its seed bootstrap and the sign-flip p over seed pairs."""
    lines = [f"| arm vs {pm['base']} | per seed pair: C_s, arm vs base | Δ mean | 95 % over seed pairs | "
             "wins / losses | sign-flip p (seeds) |", "|---|---|---|---|---|---|"]
    for m, a in pm["arms"].items():
        vs = a["vs_base"]
        per = "; ".join(f"{c:.0f}: {_f(x)} vs {_f(y)}" for c, x, y in
                        zip(a["calls_per_seed"], a["accuracy_per_seed"], a["base_accuracy_per_seed"], strict=True))
        lines.append(f"| {m} | {per} | {_f(vs['diff'], sign=True)} | {_ci(a['diff_seed_bootstrap'], sign=True)} | "
                     f"{vs['wins']} / {vs['losses']} | {_p(vs['p_sign_flip'])} |")
    return "\n".join(lines)


def matched_report(res: dict) -> str:
    """Both matched-calls tables under their headings, as OUT/report.md ends and hop2-stats prints them."""
    return ("\nAccuracy at matched executed tool calls (dev; seeds only):\n\n"
            + matched_calls_table(res["matched_calls"])
            + "\n\nAccuracy at each seed pair's matched executed tool calls (dev):\n\n"
            + pair_matched_calls_table(res["matched_calls_per_pair"]) + "\n")


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
    """hop2.run with these arms (task=webhop: on a local web served for the run), then the
    budget-matched section (recorded as dev in the ledger)."""
    cfg = with_task(cfg)
    if cfg.task == "webhop" and own_web_url(cfg) is None:
        from arpo.web.process import served_web  # noqa: PLC0415 - starts a server; only task=webhop needs one

        with served_web(WEB_CORPUS, cfg.web_port) as url:
            return run(dataclasses.replace(cfg, train_overrides=[*cfg.train_overrides, f"tools.web.url={url}"]))
    web_url = own_web_url(cfg)

    def webhop_rows() -> tuple[str, list[dict]]:
        return "sft_webhop.jsonl", webhop_sft_rows(cfg.sft_data, str(web_url))
    res = hop2.run(cfg, webhop_rows if cfg.task == "webhop" else None)
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
