"""The anchored-update ablation against the SFT start on hop2:dev (issue 59).

Per (run, arm): greedy dev accuracy, the questions it newly solves (wins) and newly fails (losses)
against the study's SFT start (docs/results/branch_rules_hop2/heldout_step_000000.json), the exact
sign test, and whether wins - losses > 2 * sqrt(wins + losses) (what the README calls "beats").
Writes anchored_ablation/results.json. Run from docs/results: python anchored_ablation/paired.py
"""

import glob
import json
import math
import platform
import subprocess

import torch
import transformers  # noqa: TID253 (a script, run once)
from scipy.stats import binomtest


def read(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def correct(records: list[dict]) -> dict[str, bool]:
    return {r["example_id"]: r["correct"] for r in records}


def main() -> None:
    start = correct(read("branch_rules_hop2/heldout_step_000000.json")["records"])
    study = read("branch_rules_hop2/results.json")["runs"]
    runs = {}
    for path in sorted(glob.glob("anchored_ablation/rl/*/dev.json")):
        name = path.split("/")[2]
        run, arm = name.split("__")
        method, seed = run.rsplit("_seed", 1)
        now = correct(read(path)["records"]["hop2:dev"])
        wins = sum(now[k] and not start[k] for k in start)
        losses = sum(start[k] and not now[k] for k in start)
        before = next(r for r in study[method] if r["seed"] == int(seed))["curve"][-1]["accuracy"]
        runs[name] = {"run": run, "arm": arm, "dev": sum(now.values()) / len(now), "wins": wins,
                      "losses": losses, "sign_p": binomtest(wins, wins + losses, 0.5).pvalue if wins + losses else 1.0,
                      "beats_start": wins - losses > 2 * math.sqrt(wins + losses),
                      "study_dev_at_step_10": before}
        print(f"{name}: dev {runs[name]['dev']:.3f} (+{wins} / -{losses}, sign p {runs[name]['sign_p']:.4f}); "
              f"the study's run at lr 3e-5: {before:.3f}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"runs": runs, "start_dev": sum(start.values()) / len(start), "split": "hop2:dev", "decoding": "greedy",
           "code": "8d83dd5 (run.sh as committed in c0d96ea)", "written_at_commit": commit,
           "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
           "machine": "2-core CPU VM shared with other jobs (load 5-9): step times are not comparable"}
    with open("anchored_ablation/results.json", "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
