"""What each run's policy does at its selected step: how many tool calls it made before answering, and
how often it was right after that many, per run and split. An accuracy says that a run failed, this
says how: on hop2 a correct answer takes two lookups, so a run that answers after one lookup (it reads
the first town's attribute) or after three (a lookup too many: a repeated one, or one relation
followed too far) shows up here, where the accuracy alone shows only a low number; on webhop it takes
four calls (web_search and browse, twice). The most common answer beside it tells a collapsed policy
that gives one answer to every question from one that still reads the pages.

Read from the evaluation records the runs keep next to a hop2 / branch-rules results.json
(`OUT/rl/<arm>_seed<k>/heldout_step_<step>.json` for dev, `.../test_eval/...` for test), at the step
`results["dev"]["selected_steps"]` names; `arpo experiment hop2-stats` prints the table where they are.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from arpo.training.rollout_log import read_run_trees
from experiments.common import eval_file, run_dir_of

# the tool calls of a correct trajectory, per task (results["settings"]["task"]; hop2 files have none)
CALLS_NEEDED = {"hop2": 2, "webhop": 4}


def most_calls(results: dict) -> int:
    """The table's last column, "≥ most calls": one past the calls a correct trajectory makes."""
    return CALLS_NEEDED[results["settings"].get("task", "hop2")] + 1


def answers_by_calls(records: list[dict]) -> dict:
    """{questions, correct, no_answer, by_calls: {k: [answers after k tool calls, of them correct]},
    modal: [the most common answer, how many gave it] or None}: one eval record per question; k = the
    record's tool calls summed over tools; an answer is a record with finish_reason "answer" (the rest,
    cut off or malformed, count as no_answer). A collapsed policy often gives one answer to every
    question (hop2: a letter; webhop: a number); modal shows it. Ties go to the answer seen first."""
    by: dict[int, list[int]] = {}
    answers: Counter[str] = Counter()
    no_answer = 0
    for r in records:
        if r.get("finish_reason") != "answer":
            no_answer += 1
            continue
        c = by.setdefault(sum(r.get("tool_calls", {}).values()), [0, 0])
        c[0] += 1
        c[1] += int(bool(r["correct"]))
        answers[str(r.get("answer") or "").strip()] += 1
    modal = list(answers.most_common(1)[0]) if answers else None
    return {"questions": len(records), "correct": sum(int(bool(r["correct"])) for r in records),
            "no_answer": no_answer, "by_calls": dict(sorted(by.items())), "modal": modal}


def modal_cell(modal: list | None, questions: int, width: int = 20) -> str:
    """A table cell for the most common answer: `answer` and its share of the questions; the answer
    cut to `width` characters (…) with | and ` made harmless for a Markdown table; – when none."""
    if not modal:
        return "–"
    a, n = modal
    a = a if len(a) <= width else a[:width - 1] + "…"
    a = a.replace("|", "/").replace("`", "'")
    return f"`{a}` {n / questions:.2f}" if a else f"(empty) {n / questions:.2f}"


def record_file(root: Path, arm: str, seed: int, step: int, split: str) -> Path:
    """Where a run keeps its eval records of `split` (dev or test) at `step`."""
    run = run_dir_of(root, arm, seed)
    return eval_file(run if split == "dev" else run / "test_eval", step)


def behaviour(results: dict, root: Path) -> dict:
    """{split: {arm: [answers_by_calls per seed, None where the records are missing]}} at each arm's
    selected step, for the splits results.json reports."""
    steps = results["dev"]["selected_steps"]
    seeds = results["settings"]["seeds"]
    out: dict = {}
    for split in ("dev", "test"):
        if not results.get(split):
            continue
        out[split] = {}
        for arm, step in steps.items():
            per_seed = []
            for seed in range(seeds):
                f = record_file(root, arm, seed, step, split)
                per_seed.append(answers_by_calls(json.loads(f.read_text())["records"]) if f.exists() else None)
            out[split][arm] = per_seed
    return out


def behaviour_table(beh: dict, split: str, most: int = 3) -> str:
    """Markdown: per arm and seed, the share of questions answered after 0 … most−1 and ≥ most tool
    calls, each with the accuracy among them in brackets, the share not answered and the most common
    answer with its share (modal_cell)."""
    heads = [f"{k} calls" for k in range(most)] + [f"≥ {most} calls"]
    lines = ["| method | seed | accuracy | " + " | ".join(heads) + " | no answer | most common answer |",
             "|" + "---|" * (len(heads) + 5)]
    for arm, per_seed in beh[split].items():
        for seed, h in enumerate(per_seed):
            if h is None:
                lines.append(f"| {arm} | {seed} | – | " + " | ".join("–" for _ in heads) + " | – | – |")
                continue
            n = h["questions"]
            cells = [[0, 0] for _ in heads]
            for k, (a, c) in h["by_calls"].items():
                cells[min(int(k), most)][0] += a
                cells[min(int(k), most)][1] += c
            shown = [f"{a / n:.2f} ({c / a:.2f})" if a else "0" for a, c in cells]
            lines.append(f"| {arm} | {seed} | {h['correct'] / n:.3f} | " + " | ".join(shown)
                         + f" | {h['no_answer'] / n:.2f} | {modal_cell(h.get('modal'), n)} |")
    return "\n".join(lines)


# --- training: what the sampled trajectories did and earned, from the rollouts the runs keep ---------

OUTCOMES = ("format error", "wrong", "right")


def outcome(t: dict) -> int:
    """A kept trajectory's outcome, an index into OUTCOMES: 0 when it carries a format error (the −1 of
    the reward, right or not), else 1 if its answer is wrong, 2 if right."""
    return 0 if t.get("format_error") else 1 + int(bool(t.get("correct")))


def samples_by_calls(trees: list[dict], first: int, last: int) -> dict:
    """{samples, by_calls: {k: [format error, wrong, right]}, first: {k: n}, last: {k: n}} over kept tree
    records (rollout_log.tree_record, each with its `step`): every sampled trajectory counts once, by
    its number of tool calls k (the calls that ran, failed ones included; a call past
    agent.max_tool_calls is not run, and its format error counts); `first` / `last` count those of
    steps `first` and `last` alone, to show the drift."""
    by: dict[int, list[int]] = {}
    at: dict[int, Counter[int]] = {first: Counter(), last: Counter()}
    n = 0
    for tree in trees:
        for t in tree["trajectories"]:
            k = len(t.get("tool_calls", []))
            by.setdefault(k, [0, 0, 0])[outcome(t)] += 1
            if tree["step"] in at:
                at[tree["step"]][k] += 1
            n += 1
    return {"samples": n, "by_calls": dict(sorted(by.items())), "first": dict(at[first]), "last": dict(at[last])}


def training(results: dict, root: Path) -> dict:
    """{arm: samples_by_calls pooled over the arm's seeds, steps 1 … settings.steps; runs: how many of
    its runs kept rollouts}, from OUT/rl/<arm>_seed<k>/rollouts."""
    steps, seeds = results["settings"]["steps"], results["settings"]["seeds"]
    out = {}
    for arm in results["dev"]["selected_steps"]:
        trees, runs = [], 0
        for seed in range(seeds):
            kept = read_run_trees(run_dir_of(root, arm, seed))
            runs += bool(kept)
            trees += [t for t in kept if 1 <= t["step"] <= steps]
        out[arm] = {**samples_by_calls(trees, 1, steps), "runs": runs}
    return out


def training_table(tr: dict, most: int = 3) -> str:
    """Markdown: per arm, its sampled training trajectories by tool calls (0 … most−1, ≥ most), each
    cell "format error / wrong / right (at the first step → at the last step)"."""
    heads = [f"{k} calls" for k in range(most)] + [f"≥ {most} calls"]
    lines = ["| method | runs | samples | " + " | ".join(heads) + " |", "|" + "---|" * (len(heads) + 3)]
    for arm, s in tr.items():
        cells = [[0, 0, 0, 0, 0] for _ in heads]  # three outcomes, then at the first and the last step
        for k, counts in s["by_calls"].items():
            c = cells[min(int(k), most)]
            for i, x in enumerate(counts):
                c[i] += x
        for j, key in ((3, "first"), (4, "last")):
            for k, x in s[key].items():
                cells[min(int(k), most)][j] += x
        shown = [f"{a} / {b} / {c} ({f} → {la})" if a + b + c else "0" for a, b, c, f, la in cells]
        lines.append(f"| {arm} | {s['runs']} | {s['samples']} | " + " | ".join(shown) + " |")
    return "\n".join(lines)
