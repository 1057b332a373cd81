"""docs/branch_rules.md quotes the committed comparisons of issue 41 (hop2, and webhop once its
results.json is committed): in each task's results section every result table is the one
`arpo experiment hop2-stats` renders from docs/results/branch_rules_<task>/results.json (and the run
dirs beside it), the file's derived sections are what today's code computes from its raw data, every
decimal number in the section's prose and in the README's bullet is one the tables print, and the
section's heading names the commit the runs ran at."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest

from arpo.data.datasets import load_examples
from experiments import answer_signal as AS
from experiments import budget_matched as B
from experiments import hop2_behaviour as HB
from experiments import hop2_report as R
from experiments import hop2_stats as H
from experiments import run_gains as G

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "branch_rules.md"
NUMBER = re.compile(r"(?<![\w.])[+\-−]?\d+\.\d+")
TASKS = ("hop2", "webhop")


def _study(task: str) -> Path:
    return ROOT / "docs" / "results" / f"branch_rules_{task}"


def _load(task: str) -> dict:
    path = _study(task) / "results.json"
    if not path.exists():
        pytest.skip(f"{path.relative_to(ROOT)} is not committed yet (the study is running)")
    return json.loads(path.read_text())


def _section(doc: str, task: str) -> str:
    """From the heading "## Results on <task>" to the next "## " heading (or the end of the file)."""
    start = doc.index(f"## Results on {task}")
    nxt = doc.find("\n## ", start + 1)
    return doc[start:] if nxt < 0 else doc[start:nxt + 1]


@pytest.fixture(scope="module", params=TASKS)
def task(request):
    return request.param


@pytest.fixture(scope="module")
def results(task):
    return _load(task)


@pytest.fixture(scope="module")
def doc():
    return DOC.read_text()


@functools.cache
def _tables_of(task: str) -> dict[str, str]:
    """A task's rendered tables, once per session (they read every run's eval records)."""
    return _tables(_load(task), _study(task))


def _tables(results: dict, study: Path) -> dict[str, str]:
    t = {"runs": R.runs_table(results), "tool calls": R.tool_calls_table(results),
         "calls to accuracy": R.calls_to_accuracy_table(results), "branches": R.branching_table(results),
         "matched calls": B.matched_calls_table(results["matched_calls"]),
         "matched calls per pair": B.pair_matched_calls_table(results["matched_calls_per_pair"])}
    beh = HB.behaviour(results, study)
    for split in ("dev", "test"):
        t[f"accuracy {split}"] = R.accuracy_table(results, split)
        t[f"comparison {split}"] = R.comparison_table(results, split)
        t[f"answers by calls {split}"] = HB.behaviour_table(beh, split, HB.most_calls(results))
    t["training samples"] = HB.training_table(HB.training(results, study), HB.most_calls(results))
    t["gains over the SFT start"] = G.gains_table(G.study_gains(study))
    if results["settings"].get("task") == "webhop":  # what the rollouts say about answering after page 1 / 2
        for k in (2, 4):
            t[f"answer after call {k}"] = AS.table(AS.study_signal(study, k), k)
    return t


def _plain(x: str) -> str:
    return x.replace("−", "-").lstrip("+-")


def _allowed(task: str) -> set[str]:
    results = _load(task)
    nums = {_plain(n) for t in _tables_of(task).values() for n in NUMBER.findall(t)}
    versions = {n for v in results["provenance"]["packages"].values() for n in NUMBER.findall(str(v or ""))}
    return nums | versions | {"0.2", "0.5", "2.5"}  # zscore's β and τ (the paper's), the 2.5 % tail of a 95 % interval


def test_the_file_holds_what_todays_code_computes(results):
    """hop2-stats rewrote the derived sections with this code: rerun it after changing the statistics."""
    again = json.loads(json.dumps(results))
    assert H.refresh(again, load_examples) == []  # its question clusters are in the file
    assert json.loads(json.dumps(again)) == results
    st = results["settings"]
    assert st["seeds"] == 5 and len(st["methods"]) == 6 and st["select"] == "last"
    assert all(len(rs) == 5 for rs in results["runs"].values())


def test_every_result_table_is_rendered_from_the_committed_json(task, doc):
    section = _section(doc, task)
    for name, table in _tables_of(task).items():
        assert table in section, f"docs/branch_rules.md: the {task} {name} table differs from the results file; " \
                                 "paste the output of `arpo experiment hop2-stats --results " \
                                 f"docs/results/branch_rules_{task}/results.json`"


def test_every_number_in_the_results_prose_is_from_the_file(task, doc):
    prose = "\n".join(ln for ln in _section(doc, task).splitlines() if not ln.startswith("|"))
    missing = sorted({n for n in NUMBER.findall(prose) if _plain(n) not in _allowed(task)})
    assert not missing, f"docs/branch_rules.md quotes numbers the {task} results file does not hold: {missing}"


def _readme_line(readme: str, start: str) -> str:
    i = readme.index(start)
    return readme[i:readme.index("\n", i)]


def test_the_readme_quotes_the_files():
    """The README's branch-rules result lines: every decimal is printed by one of the committed
    studies' tables (the gains table included), and the run counts are run_gains's."""
    readme = (ROOT / "README.md").read_text()
    for task in TASKS:
        if not (_study(task) / "results.json").exists():
            continue
        line = _readme_line(readme, f"- **{task}, branch rules**")
        missing = sorted({n for n in NUMBER.findall(line) if _plain(n) not in _allowed(task)})
        assert not missing, f"README.md's {task} branch-rules line quotes numbers its file does not hold: {missing}"
        g = G.study_gains(_study(task))
        assert f"{g['beats']} of {g['runs']} runs beat the SFT start" in line, line
        assert f"{g['collapsed']} collapsed" in line, line
        if task == "hop2":
            assert f"GRPO {g['arms']['grpo']['beats']} of 5" in line, line
            oo = g["seed_level"]["dev"]["arpo@outcome_open"]
            assert f"p {oo['p']:.3f}, {oo['p_holm']:.2f} after Holm over the 5 arms" in line, line
            assert f"test {g['sft_test']:.3f}" in line, line
        else:
            assert f"solves {round(g['sft_test'] * 60)} of 60 test questions" in line, line


def test_the_doc_states_the_run_counts_and_the_holm_correction(doc):
    """docs/branch_rules.md's status and results paragraphs quote run_gains's counts."""
    status = doc[:doc.index("## Why")]
    for task in TASKS:
        g = G.study_gains(_study(task))
        sec = _section(doc, task)
        assert f"{g['collapsed']} collapsed" in status, task
        n = {0: "none", 18: "18 of 30 runs"}.get(g["beats"], f"{g['beats']} of {g['runs']} runs")
        assert n in status, (task, n)
        ps = g["seed_level"]["dev"]
        for arm, c in ps.items():
            if c["p"] < 0.11:  # every seed-level p the prose calls small comes with its Holm value
                assert f"{c['p_holm']:.2f}" in sec, (task, arm, c)


def test_the_results_name_the_commit_they_ran_at(task, results, doc):
    prov = results["provenance"]
    assert not prov["dirty"]
    heading = _section(doc, task).splitlines()[0]
    assert f"commit {prov['commit'][:7]}" in heading, heading
