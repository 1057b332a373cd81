"""Per-seed held-out comparison of RL runs against their SFT start, as the examples report it.

    python -m examples.paired_seeds --start EVAL_SFT.json --runs EVAL_S0.json EVAL_S1.json ... \
        [--sampled-start EVAL_SFT_T1.json --sampled-runs EVAL_S0_T1.json ...] --out results.json

Each run (a seed is a run) is compared with the start on the same held-out questions
(arpo.eval.paired: wins, losses, exact sign-test p, "beats" = wins - losses > 2·√(wins + losses));
the headline is the multi-seed rate: how many seeds beat the start, and the range of accuracy over
seeds. Sampled pass@1 (temperature 1) is reported next to greedy when given. The code version and
package versions are recorded (arpo.provenance).
"""

from __future__ import annotations

import argparse
import json
import statistics

from arpo.eval.paired import accuracy_interval, paired
from arpo.provenance import provenance


def records(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    (recs,) = data["records"].values()
    return recs


def mean_score(recs: list[dict]) -> float:
    return statistics.fmean(float(r["score"]) for r in recs)


def summary(start: str, runs: list[str], sampled_start: str | None = None,
            sampled_runs: list[str] | None = None) -> dict:
    base = records(start)
    out = {"start": {"file": start, **accuracy_interval(base), "score": mean_score(base)}, "runs": []}
    if sampled_start:
        out["start"]["sampled_pass@1"] = accuracy_interval(records(sampled_start))["accuracy"]
    for i, path in enumerate(runs):
        now = records(path)
        p = paired(base, now)
        row = {"file": path, **accuracy_interval(now), "score": mean_score(now), "wins": p["wins"],
               "losses": p["losses"], "p_sign": p["p_sign"], "beats_start": p["net"] > p["noise"],
               "worse_than_start": p["net"] < -p["noise"]}
        if sampled_runs:
            row["sampled_pass@1"] = accuracy_interval(records(sampled_runs[i]))["accuracy"]
        out["runs"].append(row)
    accs = [r["accuracy"] for r in out["runs"]]
    out["seeds"] = len(accs)
    out["seeds_beating_start"] = sum(r["beats_start"] for r in out["runs"])
    out["seeds_worse_than_start"] = sum(r["worse_than_start"] for r in out["runs"])
    out["accuracy_mean_over_seeds"] = statistics.fmean(accs) if accs else None
    out["accuracy_range_over_seeds"] = [min(accs), max(accs)] if accs else None
    out["provenance"] = provenance()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--start", required=True, help="the SFT start's greedy eval file (arpo eval --out)")
    ap.add_argument("--runs", nargs="+", required=True, help="each seed's greedy eval file")
    ap.add_argument("--sampled-start", help="the start's eval at temperature 1")
    ap.add_argument("--sampled-runs", nargs="+", help="each seed's eval at temperature 1, in --runs order")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.sampled_runs and len(a.sampled_runs) != len(a.runs):
        ap.error("--sampled-runs needs one file per --runs file")
    s = summary(a.start, a.runs, a.sampled_start, a.sampled_runs)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(s, f, indent=1)
    st = s["start"]
    print(f"start: {st['accuracy']:.3f}" + (f" (sampled {st['sampled_pass@1']:.3f})" if "sampled_pass@1" in st else ""))
    for r in s["runs"]:
        print(f"{r['file']}: {r['accuracy']:.3f} (+{r['wins']} / -{r['losses']}, sign p {r['p_sign']:.4f}"
              + (", beats the start" if r["beats_start"] else "") + ")")
    print(f"{s['seeds_beating_start']} of {s['seeds']} seeds beat the start; accuracy range over seeds "
          f"{s['accuracy_range_over_seeds'][0]:.3f}-{s['accuracy_range_over_seeds'][1]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
