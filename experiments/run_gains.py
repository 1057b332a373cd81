"""What a branch-rules study (docs/results/branch_rules_<task>) says run by run, recomputed from its
committed files (issue 59, finding 5): each run's test gain over the SFT start with its paired noise,
how many runs per arm beat the start beyond that noise, which runs collapsed, and the arms' seed-level
tests against the base arm with a Holm correction over the arms compared.

* **Gain over the SFT start** (eval/paired.py): the run's test records at its tested step against the
  SFT start's test records, question by question; it *beats* the start when wins − losses > 2·√(wins +
  losses) (≈ a two-sided 95 % sign test; `p_sign` is the exact one). The studies evaluated the SFT
  start on dev only; its test records are those of the same SFT model evaluated by the quick-start hop2
  trial and by examples/deep_search (SFT_TEST: the same config, data and steps, and the same greedy dev
  answer, text for text, on all 60 dev questions — `same_start` checks that).
* **Collapsed**: the tested step's dev accuracy ≤ ¼ of the run's best dev accuracy, the SFT start
  included (training/health.py's `heldout_collapse` rule, applied to the run's evaluations).
* **Holm** (Holm 1979): the m seed-level p values p₍₁₎ ≤ … ≤ p₍ₘ₎ become
  p̃₍ᵢ₎ = max_{j ≤ i} min(1, (m − j + 1)·p₍ⱼ₎), which controls the family-wise error over the m arms.

    python -m experiments.run_gains docs/results/branch_rules_hop2   # prints the summary
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from arpo.eval.paired import paired
from experiments.common import eval_file, run_dir_of

# the SFT start's test records, per task: (file relative to docs/results, dataset key in its records)
SFT_TEST = {"hop2": ("quickstart_hop2_trial/eval_sft.json", "hop2"),
            "webhop": ("deep_search_webhop/eval_sft.json", "webhop")}
COLLAPSE_FRACTION = 0.25  # training/health.py: heldout_collapse fires at ≤ ¼ of the run's best


def holm(ps: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p values of a family {name: p} (see the module docstring)."""
    order = sorted(ps, key=lambda k: ps[k])
    m, out, running = len(order), {}, 0.0
    for j, k in enumerate(order):
        running = max(running, min(1.0, (m - j) * ps[k]))
        out[k] = running
    return out


def collapsed(curve: list[dict], tested_step: int) -> bool:
    """The run's dev accuracy at the tested step ≤ ¼ of its best dev accuracy (SFT start included)."""
    best = max(p["accuracy"] for p in curve)
    at = next(p["accuracy"] for p in curve if p["step"] == tested_step)
    return at <= COLLAPSE_FRACTION * best


def _records(path: Path, key: str | None = None) -> list[dict]:
    data = json.loads(path.read_text())["records"]
    return data[next(k for k in data if k.split(":")[0] == key and k.endswith(":test"))] if key else data


def sft_test_records(study: Path, task: str) -> list[dict]:
    """The SFT start's test records (SFT_TEST), from the docs/results folder that holds `study`."""
    rel, key = SFT_TEST[task]
    return _records(study.parent / rel, key)


def same_start(study: Path, task: str) -> bool:
    """The SFT_TEST file's dev answers are the study's SFT start's (heldout_step_000000.json), text for
    text: the same model, greedy."""
    rel, key = SFT_TEST[task]
    other = json.loads((study.parent / rel).read_text())["records"][f"{key}:dev"]
    mine = json.loads((study / "heldout_step_000000.json").read_text())["records"]
    texts = {r["example_id"]: r["text"] for r in other}
    return len(texts) == len(mine) and all(texts.get(r["example_id"]) == r["text"] for r in mine)


def study_gains(study: str | Path) -> dict:
    """{task, sft_test, arms: {arm: {runs: [{seed, test, wins, losses, net, noise, p_sign, beats,
    collapsed}], beats, collapsed}}, beats, collapsed, runs, seed_level: {split: {arm: {p, p_holm,
    diff}}}} of one branch-rules study folder (its results.json, run dirs and the SFT start's test)."""
    study = Path(study)
    results = json.loads((study / "results.json").read_text())
    st = results["settings"]
    task = st.get("task", "hop2")
    sft = sft_test_records(study, task)
    base = st["methods"][-1]
    out: dict = {"task": task, "sft_test": sum(bool(r["correct"]) for r in sft) / len(sft), "arms": {}}
    for arm, runs in results["runs"].items():
        step = results["dev"]["selected_steps"][arm]
        rows = []
        for r in runs:
            recs = _records(eval_file(run_dir_of(study, arm, r["seed"]) / "test_eval", step))
            p = paired(sft, recs)
            rows.append({"seed": r["seed"], "test": sum(bool(x["correct"]) for x in recs) / len(recs),
                         **{k: p[k] for k in ("wins", "losses", "net", "noise", "p_sign")},
                         "beats": p["significant"] and p["net"] > 0, "collapsed": collapsed(r["curve"], step)})
        out["arms"][arm] = {"runs": rows, "beats": sum(x["beats"] for x in rows),
                            "collapsed": sum(x["collapsed"] for x in rows)}
    out["runs"] = sum(len(a["runs"]) for a in out["arms"].values())
    out["beats"] = sum(a["beats"] for a in out["arms"].values())
    out["collapsed"] = sum(a["collapsed"] for a in out["arms"].values())
    out["seed_level"] = {}
    for split in ("dev", "test"):
        if split not in results.get("statistics", {}):
            continue
        cmp = {arm: results["statistics"][split][f"{arm}_vs_{base}"]["seed_level"]
               for arm in st["methods"] if arm != base}
        adj = holm({arm: c["p_permutation"] for arm, c in cmp.items()})
        out["seed_level"][split] = {arm: {"diff": c["diff"], "p": c["p_permutation"], "p_holm": adj[arm]}
                                    for arm, c in cmp.items()}
    return out


def summary(g: dict) -> str:
    """A few lines of text: per arm, runs beating the start and collapsed; the Holm-corrected tests."""
    lines = [f"{g['task']}: SFT start test {g['sft_test']:.3f}; {g['beats']} of {g['runs']} runs beat it on "
             f"test beyond the paired noise; {g['collapsed']} collapsed"]
    for arm, a in g["arms"].items():
        runs = ", ".join(f"{x['test']:.3f} (+{x['wins']}/−{x['losses']}{' *' if x['beats'] else ''}"
                         f"{' collapsed' if x['collapsed'] else ''})" for x in a["runs"])
        lines.append(f"  {arm}: beats {a['beats']}/{len(a['runs'])}, collapsed {a['collapsed']}: {runs}")
    for split, arms in g["seed_level"].items():
        lines.append(f"  {split}, vs the base, permutation p → Holm over {len(arms)}: " + "; ".join(
            f"{arm} {c['diff']:+.3f} p {c['p']:.3f} → {c['p_holm']:.2f}" for arm, c in arms.items()))
    return "\n".join(lines)


def gains_table(g: dict) -> str:
    """Markdown: per arm, each run's test accuracy and paired solves / fails against the SFT start
    (* beyond the paired noise; c collapsed), the runs that beat it, the runs that collapsed, and the
    arm's seed-level permutation p against the base on dev and test with Holm's correction."""
    seeds = max(len(a["runs"]) for a in g["arms"].values())
    lines = ["| method | " + " | ".join(f"seed {k}: test, vs SFT" for k in range(seeds)) + " | beat the SFT start | "
             "collapsed | dev p → Holm | test p → Holm |", "|" + "---|" * (seeds + 5)]
    for arm, a in g["arms"].items():
        cells = [f"{x['test']:.3f}, +{x['wins']} / −{x['losses']}" + (" *" if x["beats"] else "")
                 + (" c" if x["collapsed"] else "") for x in a["runs"]]
        tests = [(f"{c['p']:.3f} → {c['p_holm']:.2f}" if (c := g["seed_level"].get(sp, {}).get(arm)) else "base")
                 for sp in ("dev", "test")]
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {a['beats']} of {len(a['runs'])} | {a['collapsed']} | "
                     + " | ".join(tests) + " |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m experiments.run_gains STUDY_DIR ...
    for d in sys.argv[1:]:
        g = study_gains(d)
        print(summary(g) + "\n\n" + gains_table(g) + "\n")
