"""What the training signal said about answering at a given depth, read from a study's kept rollouts
(issue 59, finding 3): per arm and step, of the sampled trajectories that made at least k tool calls,
the share that answered right after call k (p(answer now)), and the summed advantage those
answering samples were trained with.

A trajectory's advantage for "answer now" is the advantage on its last trained token (the answer is
its own, never a shared prefix, so soft attribution leaves it the trajectory's own advantage). On
webhop k = 2 is "answer after the first page" (web_search, browse), never right; k = 4 is "answer
after the second page", the worked trajectory.

    python -m experiments.answer_signal docs/results/branch_rules_webhop   # prints the table
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from arpo.training.rollout_log import read_run_trees
from experiments.common import run_dir_of


def last_advantage(t: dict) -> float:
    """The advantage on a kept trajectory's last trained token (mask 1); 0 when none is trained."""
    return next((a for a, m in zip(reversed(t["advantage"]), reversed(t["mask"]), strict=True) if m), 0.0)


def at_depth(trees: list[dict], k: int) -> dict[int, dict]:
    """{step: {reached, answered, right, advantage}}: of the trajectories with ≥ k tool calls, those
    that answered after exactly k (finish_reason "answer"), how many of them were right, and the sum of
    their last_advantage, per training step of the kept tree records."""
    out: dict[int, dict] = {}
    for tree in trees:
        s = out.setdefault(tree["step"], {"reached": 0, "answered": 0, "right": 0, "advantage": 0.0})
        for t in tree["trajectories"]:
            n = len(t.get("tool_calls", []))
            s["reached"] += n >= k
            if n == k and t.get("finish_reason") == "answer":
                s["answered"] += 1
                s["right"] += int(bool(t.get("correct")))
                s["advantage"] += last_advantage(t)
    return dict(sorted(out.items()))


def study_signal(study: str | Path, k: int) -> dict[str, dict[int, dict]]:
    """{arm: at_depth over the arm's seeds pooled} for a branch-rules study folder."""
    study = Path(study)
    st = json.loads((study / "results.json").read_text())["settings"]
    return {arm: at_depth([t for s in range(st["seeds"]) for t in read_run_trees(run_dir_of(study, arm, s))], k)
            for arm in st["methods"]}


def table(sig: dict[str, dict[int, dict]], k: int) -> str:
    """Markdown: per arm and step, "p(answer after call k) (answered / reached); Σ advantage"."""
    steps = sorted({s for a in sig.values() for s in a})
    lines = ["| method | " + " | ".join(f"step {s}" for s in steps) + " |", "|" + "---|" * (len(steps) + 1)]
    for arm, per in sig.items():
        cells = [f"{c['answered'] / c['reached']:.2f}; {c['advantage']:+.1f}" if (c := per.get(s)) and c["reached"]
                 else "–" for s in steps]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m experiments.answer_signal STUDY_DIR
    for depth in (2, 4):
        print(f"answer after call {depth}: share of the samples that reached it; summed advantage\n")
        print(table(study_signal(sys.argv[1], depth), depth) + "\n")
