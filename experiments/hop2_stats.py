"""The `statistics` section of hop2's results.json (issue 38), computed from the file alone, so that it
can be recomputed for a results.json already written:

    arpo experiment hop2-stats --results runs/hop2/results.json   # rewrites its derived sections (refresh)
                                                                  # and prints the tables (hop2_report.py)

Every interval says what it resampled (`resampled`) and every test its independent unit (`unit`):

* per split and method: the seed bootstrap of the mean accuracy (questions fixed) and, where the file
  keeps per-question correctness (`<split>.per_question`, written since issue 38), the crossed
  bootstrap over seeds and question clusters (experiments/clustered.py); next to them the question
  bootstrap the protocol reported (questions as independent, no seed variance);
* per comparison with the last method (e.g. grpo): the seed-level tests (exact permutation over the
  runs' labels, exact sign flip by seed), the seed bootstrap of the difference, and with per-question
  data the crossed bootstrap of the difference and the per-cluster sign test; next to them the
  per-question sign test as reported;
* training tool calls: the ratio of the calls issued with a two-stage bootstrap (seed pairs, then
  steps), the steps-only interval as reported, the per-seed ratios and their sign-flip test;
* calls to reach an accuracy (the paper's metric): cumulative training tool calls at which each arm's
  seed-mean dev curve first reaches 25 / 50 / 75 / 100 % of the way from the SFT start to the highest
  accuracy both reach (common.summarize), and per seed pair.

`refresh` recomputes every section derived from the runs (question clusters a file was written
without, `statistics`, and for branch-rules files the per-pair matched-calls reading); the command,
`python -m experiments.hop2_stats FILE` and the doc tests all go through it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from arpo.errors import ArpoError
from experiments import clustered as C
from experiments.budget_matched import matched_report, pair_matched_calls
from experiments.common import summarize
from experiments.hop2_behaviour import behaviour, behaviour_table, most_calls, training, training_table
from experiments.hop2_figures import plot
from experiments.hop2_report import report

SPLIT_DATA = {"dev": "eval_data", "test": "test_data"}  # the settings key naming each split's dataset
QUESTION_PAIRED = "question (as independent; per-question accuracy averaged over seeds)"
QUESTION_BOOTSTRAP = "questions as independent units (per-question accuracy averaged over seeds); no seed variance"
NEEDS_RECORDS = "needs per-question correctness per seed (<split>.per_question), which this results.json does not keep"


def question_cluster(ex: dict) -> str:
    """A question's cluster, the unit the cluster-aware statistics resample: its declared `cluster`
    (hop2: "first-hop town/relation"), else the pages its answer rests on, joined by "/" (`supporting`:
    webhop's "first-hop town/second-hop town", which the three questions that differ only in the
    attribute read last share), else the question itself."""
    if ex.get("cluster"):
        return str(ex["cluster"])
    if ex.get("supporting"):
        return "/".join(map(str, ex["supporting"]))
    return str(ex["id"])


def unclustered(results: dict) -> list[str]:
    """The splits whose per-question table has every question as its own cluster."""
    return [sp for sp in ("dev", "test")
            if (pq := (results.get(sp) or {}).get("per_question")) and pq["clusters"] == pq["example_ids"]]


def fill_clusters(results: dict, rows: dict[str, list[dict]]) -> list[str]:
    """Give each `unclustered` split's per-question table the clusters `question_cluster` reads off
    the split's dataset `rows` ({split: rows}) (webhop results written before question_cluster, which
    counted the questions of one path as independent). The splits it changed; their `clusters_from`
    says so."""
    changed = []
    for split in unclustered(results):
        if split not in rows:
            continue
        pq = results[split]["per_question"]
        by_id = {str(ex["id"]): question_cluster(ex) for ex in rows[split]}
        new = [by_id.get(q, q) for q in pq["example_ids"]]
        if new != pq["clusters"]:
            pq["clusters"], pq["clusters_from"] = new, "hop2_stats.question_cluster (hop2-stats)"
            changed.append(split)
    return changed


def per_question(records: dict[str, list[list[dict]]], clusters: dict[str, str]) -> dict:
    """{example_ids, clusters, <method>: {correct: [[0/1 per question] per seed], tool_calls: [[...]]}}:
    the eval records of one split in a compact, question-ordered table (example_id order of the first
    run); `clusters` maps example_id -> its cluster (a question without one is its own)."""
    first = next(iter(records.values()))[0]
    ids = [r["example_id"] for r in first]
    out: dict = {"example_ids": ids, "clusters": [clusters.get(q, q) for q in ids]}
    for m, runs in records.items():
        rows = [{r["example_id"]: r for r in recs} for recs in runs]
        out[m] = {"correct": [[int(bool(by[q]["correct"])) for q in ids] for by in rows],
                  "tool_calls": [[sum((by[q].get("tool_calls") or {}).values()) for q in ids] for by in rows]}
    return out


def _seeds_only(res: dict, label: str) -> dict:
    """A crossed bootstrap of one score per run: say so (no questions, no clusters were resampled)."""
    return {**{k: v for k, v in res.items() if k not in ("questions", "clusters")}, "resampled": label}


def arm_stats(split: dict, m: str, pq: dict | None, opts: dict) -> dict:
    """One method on one split: mean, per seed, the seed bootstrap and (with per-question data) the
    crossed bootstrap, and the reported question bootstrap, each labelled."""
    accs = split[m]["accuracy_per_seed"]
    out: dict = {"accuracy_mean": split[m]["accuracy_mean"], "accuracy_per_seed": accs,
           "seed_bootstrap": _seeds_only(C.crossed_bootstrap_mean([[a] for a in accs], ["all"], **opts),
                                         "seeds only (each run's accuracy; questions fixed)"),
           "crossed_bootstrap": (C.crossed_bootstrap_mean(pq[m]["correct"], pq["clusters"], **opts) if pq else None),
           "question_bootstrap_as_reported": {**split[m]["bootstrap"], "resampled": QUESTION_BOOTSTRAP}}
    if not pq:
        out["crossed_bootstrap_note"] = NEEDS_RECORDS
    return out


def comparison(split: dict, m: str, base: str, pq: dict | None, opts: dict) -> dict:
    """Method m against the base method on one split: seed-level tests and intervals, and with
    per-question data the crossed bootstrap of the difference and the per-cluster sign test."""
    a, b = split[m]["accuracy_per_seed"], split[base]["accuracy_per_seed"]
    out: dict = {"seed_level": C.seed_level(a, b),
           "seed_bootstrap_diff": _seeds_only(C.crossed_bootstrap_diff([[x] for x in a], [[x] for x in b], ["all"],
                                                                       **opts),
                                              "each arm's seeds (each run's accuracy; questions fixed)"),
           "crossed_bootstrap_diff": (C.crossed_bootstrap_diff(pq[m]["correct"], pq[base]["correct"], pq["clusters"],
                                                               **opts) if pq else None),
           "cluster_paired": C.cluster_paired(pq[m]["correct"], pq[base]["correct"], pq["clusters"]) if pq else None,
           "question_paired_as_reported": {**split["paired"][f"{m}_vs_{base}"],
                                           "unit": QUESTION_PAIRED}}
    if not pq:
        out["cluster_note"] = NEEDS_RECORDS
    return out


def split_section(split: dict, methods: list[str], opts: dict) -> dict:
    base, pq = methods[-1], split.get("per_question")
    out: dict = {m: arm_stats(split, m, pq, opts) for m in methods}
    out.update({f"{m}_vs_{base}": comparison(split, m, base, pq, opts) for m in methods if m != base})
    return out


def seed_step_calls(runs: list[dict], steps: int) -> list[list[float]]:
    """calls[s][t]: training tool calls issued by seed s's run at step t+1 (its first `steps` steps)."""
    return [[float(p.get("tool_calls_issued", 0)) for p in r["per_step"][:steps]] for r in runs]


def tool_calls_section(results: dict, methods: list[str], opts: dict) -> dict:
    base, runs = methods[-1], results["runs"]
    steps = min(len(r["per_step"]) for m in methods for r in runs[m])
    b = seed_step_calls(runs[base], steps)
    out = {}
    for m in methods[:-1]:
        a = seed_step_calls(runs[m], steps)
        ok = all(sum(x) > 0 and sum(y) > 0 for x, y in zip(a, b, strict=True))  # else a ratio is undefined
        reported = (results.get("dev") or {}).get("tool_call_ratio", {}).get(f"{m}/{base}")
        out[f"{m}/{base}"] = {
            "two_stage": C.two_stage_ratio_ci(a, b, **opts) if ok else None,
            "per_seed": [sum(x) / sum(y) if sum(y) else None for x, y in zip(a, b, strict=True)],
            "p_sign_flip_log_ratio": C.log_ratio_sign_flip_p([sum(x) for x in a], [sum(y) for y in b]) if ok else None,
            "per_seed_unit": "seed pair (run s of each arm: the same prompts at every step)",
            "steps_only_as_reported": {**reported, "resampled": "steps (calls summed over seeds per step); no seed "
                                       "variance"} if reported else None}
    return out


def calls_to_accuracy(results: dict, methods: list[str]) -> dict:
    """Per method vs the base: common.summarize's calls-to-reach levels (seed-mean curves of dev
    accuracy against cumulative training calls, linear interpolation) and per seed pair."""
    base, out = methods[-1], {}
    for m in methods[:-1]:
        s = summarize({m: results["runs"][m], base: results["runs"][base]}, results["start_dev"]["accuracy"], m, base)
        out[f"{m}/{base}"] = {
            "per_step_ratio": s["per_step_tool_call_ratio"], "target_accuracy": s["target_accuracy"],
            "levels": [{"fraction": float(k), **v} for k, v in s["ratio_levels"].items()],
            "per_seed_pair": s["per_seed_ratio"],
            "how": "calls at which the seed-mean dev curve first reaches start + f·(target − start), linear "
                   "interpolation between evaluations; target = the highest seed-mean accuracy both reach"}
    return out


def bootstrap_opts(settings: dict) -> dict:
    """The bootstrap settings (clustered.py's n_resamples, level, seed) of a results.json's `settings`."""
    s = settings
    return {"n_resamples": s["bootstrap_resamples"], "level": s["level"], "seed": s["bootstrap_seed"]}


def statistics(results: dict) -> dict:
    """The statistics section of a hop2 results.json (see the module docstring)."""
    st = results["settings"]
    methods = list(st["methods"])
    opts = bootstrap_opts(st)
    out: dict = {"methods": methods, "base": methods[-1]}
    for split in ("dev", "test"):
        if results.get(split):
            out[split] = split_section(results[split], methods, opts)
    out["tool_calls"] = tool_calls_section(results, methods, opts)
    out["calls_to_accuracy"] = calls_to_accuracy(results, methods)
    return out


def load(path: str | Path) -> dict:
    """A hop2 results.json (an ArpoError naming the file when it is not one)."""
    p = Path(path)
    try:
        results = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ArpoError(f"{p}: cannot read a results.json ({e})") from e
    if "runs" not in results or "settings" not in results:
        raise ArpoError(f"{p}: not a hop2 results.json (no 'runs' / 'settings')")
    return results


def save(path: str | Path, results: dict) -> None:
    Path(path).write_text(json.dumps(results, indent=1, default=str) + "\n")


def refresh(results: dict, rows_of: Callable[[str], list[dict]]) -> list[str]:
    """Recompute, in place, every section of `results` derived from its runs: the question clusters of
    the splits written without them (fill_clusters, from `rows_of(data)`: the rows of the split's
    dataset, read only for such splits), `statistics`, and where the file has `matched_calls`
    (branch-rules) `matched_calls_per_pair` (also for files written before it). The splits whose
    clusters it filled."""
    data = {sp: results["settings"][SPLIT_DATA[sp]] for sp in unclustered(results)}
    filled = fill_clusters(results, {sp: rows_of(d) for sp, d in data.items()}) if data else []
    results["statistics"] = statistics(results)
    if results.get("matched_calls"):
        results["matched_calls_per_pair"] = pair_matched_calls(results["runs"], bootstrap_opts(results["settings"]))
    return filled


def recompute(path: str | Path) -> list[str]:
    """refresh() the results.json at `path` with the datasets' rows, and save it; the splits whose
    clusters it filled."""
    from arpo.data.datasets import load_examples  # noqa: PLC0415 - only for files written without clusters

    results = load(path)
    filled = refresh(results, load_examples)
    save(path, results)
    return filled


def command(args) -> int:
    """`arpo experiment hop2-stats --results FILE [--out DIR]`: refresh the results.json in place, draw its
    figures into DIR with this version's drawing code, print the tables docs/experiment_hop2.md quotes
    (and, where the runs' eval records sit beside the file, what the policies do: hop2_behaviour.py)."""
    from arpo.data.datasets import load_examples  # noqa: PLC0415 - only for files written without clusters

    if not args.results:
        raise ArpoError("hop2-stats needs --results PATH (a results.json of hop2-arpo-vs-grpo)")
    results = load(args.results)
    for sp in refresh(results, load_examples):  # webhop files written before question_cluster
        print(f"{sp}: question clusters from the dataset's rows ({results['settings'][SPLIT_DATA[sp]]}; "
              "hop2_stats.question_cluster)", file=sys.stderr)
    save(args.results, results)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        for f in plot(results, Path(args.out)):
            print(f"wrote {f}", file=sys.stderr)
    print(report(results), end="")
    if results.get("matched_calls"):  # branch-rules: accuracy at matched executed tool calls
        print(matched_report(results), end="")
    root = Path(args.results).parent
    if (root / "rl").is_dir():  # the runs' eval records are there: what the policies do
        beh = behaviour(results, root)
        for split in beh:
            print(f"\nAnswers by tool calls, {split} (share of questions; accuracy among them; "
                  "the most common answer):\n\n" + behaviour_table(beh, split, most_calls(results)))
        steps = results["settings"]["steps"]
        print(f"\nTraining samples by tool calls (pooled over seeds and steps 1–{steps}: format error / wrong / "
              f"right; in brackets the samples at step 1 → step {steps}):\n\n"
              + training_table(training(results, root), most_calls(results)))
    return 0


if __name__ == "__main__":  # python -m experiments.hop2_stats RESULTS.json
    recompute(sys.argv[1])
