"""The deep-search example's measured runs (issue 40) are quoted from their committed files: every table in
examples/deep_search/README.md's "Measured" sections is the one `tables` renders from
docs/results/deep_search_webhop/ (the run of today's example) and its before_copied_line/ (the run before
the worked trajectories copied the relation's line, and its continuation to 14 steps): the two `arpo eval
--out` files and `arpo compare --out` of each; docs/deep_search.md quotes the same pass@1 and paired
counts (the main README gives one line and links there: tests/experiments/test_results_claims.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RES = ROOT / "docs" / "results" / "deep_search_webhop"
BEFORE = RES / "before_copied_line"
LABELS = {"sft": "SFT", "arpo": "ARPO", "arpo14": "ARPO, 14 steps"}


def _load(name: str, where: Path = RES) -> dict:
    return json.loads((where / name).read_text())


def _step_metrics(path: Path) -> list[dict]:
    """The per-step rows (those with a reward) of a run's metrics.jsonl."""
    rows = (json.loads(x) for x in path.read_text().splitlines() if x.strip())
    return [m for m in rows if "reward_mean" in m]


def accuracy_table(cmp: dict) -> str:
    """pass@1 per model and split with its 95 % Wilson interval over questions."""
    splits = list(dict.fromkeys(iv["dataset"] for iv in cmp["intervals"]))
    lines = ["| model | " + " | ".join(splits) + " |", "|---|" + "---|" * len(splits)]
    for label in dict.fromkeys(iv["label"] for iv in cmp["intervals"]):
        cells = []
        for s in splits:
            iv = next(x for x in cmp["intervals"] if x["dataset"] == s and x["label"] == label)
            cells.append(f"{iv['accuracy']:.3f} [{iv['ci_low']:.3f}, {iv['ci_high']:.3f}]")
        lines.append(f"| {LABELS.get(label, label)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_table(cmp: dict) -> str:
    """Per split, SFT -> ARPO on the same questions: newly solved, newly failed, net, the paired noise
    2·sqrt(wins + losses) and the two-sided sign-test p."""
    lines = ["| split | newly solved | newly failed | net | noise | sign p |", "|---|---|---|---|---|---|"]
    for p in cmp["paired"]:
        lines.append(f"| {p['dataset']} | {p['wins']} | {p['losses']} | {p['net']:+d} | {p['noise']:.1f} | "
                     f"{p['p_sign']:.3f} |")
    return "\n".join(lines)


def tools_table(evals: dict[str, dict]) -> str:
    """Per model and split, means per question: web_search and browse calls, distinct pages read, the
    share that opened every supporting page, the share of answers shown on a page read, format errors."""
    lines = ["| model | split | web_search | browse | pages read | all supporting opened | answer on a page read "
             "| format errors |", "|---|---|---|---|---|---|---|---|"]
    for label, ev in evals.items():
        for split, r in ev["results"].items():
            lines.append(f"| {LABELS.get(label, label)} | {split} | {r.get('tool_calls/web_search', 0.0):.2f} | "
                         f"{r.get('tool_calls/browse', 0.0):.2f} | {r['deep_search/pages_read']:.2f} | "
                         f"{r['deep_search/supporting_opened']:.2f} | {r['deep_search/answer_on_page']:.2f} | "
                         f"{r['format_error_rate']:.3f} |")
    return "\n".join(lines)


ASKED = re.compile(r"<think>The (\w+) town")  # the relation the trajectory's plan names (webhop's SFT format)
LISTED = re.compile(r"The (\w+) town of \w+ is (\w+)\.\n")  # the first page's (relation, town) lines, in order
# (a line the model copies into its <think> ends with "</think>", not a newline)


def relation_table(evals: dict[str, dict]) -> str:
    """Per model and split, correct / questions when the asked relation's line comes first on the first
    page read, and when it comes second (each first page names two related towns)."""
    lines = ["| model | split | asked relation listed first | listed second |", "|---|---|---|---|"]
    for label, ev in evals.items():
        for split, recs in ev["records"].items():
            n = {True: [0, 0], False: [0, 0]}
            for r in recs:
                asked, listed = ASKED.search(r["text"]), LISTED.findall(r["text"])
                if asked and listed:
                    cell = n[listed[0][0] == asked.group(1)]
                    cell[0] += bool(r["correct"])
                    cell[1] += 1
            lines.append(f"| {LABELS.get(label, label)} | {split} | {n[True][0]} / {n[True][1]} | "
                         f"{n[False][0]} / {n[False][1]} |")
    return "\n".join(lines)


def error_table(evals: dict[str, dict]) -> str:
    """Per model and split, the wrong answers by kind: a format error (no well-formed answer); the second
    page read is another town the first page names (the wrong relation); the second hop went back to the
    first town (its number answered); anything else."""
    lines = ["| model | split | wrong | format error | another town of page 1 | the first town again | other |",
             "|---|---|---|---|---|---|---|"]
    for label, ev in evals.items():
        for split, recs in ev["records"].items():
            kinds = {"format": 0, "other_town": 0, "first_again": 0, "other": 0}
            for r in recs:
                if r["correct"]:
                    continue
                ds = r["deep_search"]
                pages = [u.rsplit("/", 1)[-1] for u in ds["pages"]]
                named = {town for _, town in LISTED.findall(r["text"])}
                if not r["format_ok"]:
                    kinds["format"] += 1
                elif len(pages) > 1 and pages[1] in named and pages[1] != ds["supporting"][1]:
                    kinds["other_town"] += 1
                elif pages == ds["supporting"][:1]:
                    kinds["first_again"] += 1
                else:
                    kinds["other"] += 1
            lines.append(f"| {LABELS.get(label, label)} | {split} | {sum(kinds.values())} | " +
                         " | ".join(str(v) for v in kinds.values()) + " |")
    return "\n".join(lines)


def tables(where: Path = RES) -> str:
    cmp = _load("compare.json", where)
    evals = {"sft": _load("eval_sft.json", where), "arpo": _load("eval_arpo.json", where)}
    return "\n\n".join([accuracy_table(cmp), paired_table(cmp), tools_table(evals), error_table(evals),
                         relation_table(evals)])


def continued_tables() -> str:
    """The same run continued to 14 steps (continued/): SFT -> 14 steps, pass@1, paired, errors, relation."""
    cmp = _load("continued/compare.json", BEFORE)
    evals = {"arpo14": _load("continued/eval_arpo14.json", BEFORE)}
    return "\n\n".join([accuracy_table(cmp), paired_table(cmp), error_table(evals), relation_table(evals)])


def test_the_example_readme_quotes_the_committed_run():
    readme = (ROOT / "examples" / "deep_search" / "README.md").read_text()
    for table in tables().split("\n\n") + tables(BEFORE).split("\n\n") + continued_tables().split("\n\n"):
        assert table in readme, ("examples/deep_search/README.md: a measured table differs from "
                                 f"docs/results/deep_search_webhop/; expected:\n{table}")


def test_the_deep_search_page_quotes_the_same_numbers():
    acc, pairs = {}, []
    for where, name in ((RES, "compare.json"), (BEFORE, "compare.json"), (BEFORE, "continued/compare.json")):
        cmp = _load(name, where)
        acc |= {(iv["label"], iv["dataset"]): f"{iv['accuracy']:.3f}" for iv in cmp["intervals"]}
        pairs += [f"+{p['wins']} / −{p['losses']}" for p in cmp["paired"]]
    for doc in ("docs/deep_search.md",):
        text = (ROOT / doc).read_text()
        for key, val in acc.items():
            assert val in text, f"{doc}: {key} pass@1 {val} is not quoted"
        for p in pairs:
            assert p in text, f"{doc}: the paired count {p} is not quoted"


def test_the_files_are_one_run_of_the_committed_example():
    """The two evals used the example's settings (tools, result sizes, budget), greedy, on the full splits."""
    for name in ("eval_sft.json", "eval_arpo.json", "before_copied_line/eval_sft.json",
                 "before_copied_line/eval_arpo.json", "before_copied_line/continued/eval_arpo14.json"):
        ev = _load(name)
        assert ev["temperature"] == 0.0, name
        assert {k: v["questions"] for k, v in ev["results"].items()} == {"webhop:dev": 60, "webhop:test": 60}
        assert all(v["tools"] == ["web_search", "browse"] for v in ev["results"].values())
    runs = {where: _step_metrics(where / "arpo_metrics.jsonl") for where in (RES, BEFORE)}
    for metrics in runs.values():
        steps = [m["step"] for m in metrics]
        assert steps == list(range(1, len(steps) + 1)) and steps
    for name in ("arpo_provenance.json", "before_copied_line/arpo_provenance.json",
                 "before_copied_line/continued/arpo_provenance.json"):  # a list: start, then each resume
        prov = _load(name)
        assert prov and all(p["commit"] == prov[0]["commit"] and not p["dirty"] for p in prov), name
    six = runs[BEFORE]  # continued to 14 steps: the same run, resumed
    assert _step_metrics(BEFORE / "continued" / "arpo_metrics.jsonl")[:len(six)] == six
