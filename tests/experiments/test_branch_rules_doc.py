"""docs/branch_rules.md quotes the committed hop2 comparison (issue 41): every result table is the one
`arpo experiment hop2-stats` renders from docs/results/branch_rules_hop2/results.json (and the run dirs
beside it), the file's derived sections are what today's code computes from its raw data, every decimal
number in the results' prose and in the README's bullet is one the tables print, and the results heading
names the commit the runs ran at."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from arpo.experiments import branch_rules as B
from arpo.experiments import hop2_behaviour as HB
from arpo.experiments import hop2_report as R
from arpo.experiments import hop2_stats as H

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "branch_rules.md"
STUDY = ROOT / "docs" / "results" / "branch_rules_hop2"
NUMBER = re.compile(r"(?<![\w.])[+\-−]?\d+\.\d+")
START, END = "## Results on hop2", "## Results on webhop"


@pytest.fixture(scope="module")
def results():
    return json.loads((STUDY / "results.json").read_text())


@pytest.fixture(scope="module")
def doc():
    return DOC.read_text()


def _tables(results: dict) -> dict[str, str]:
    t = {"runs": R.runs_table(results), "tool calls": R.tool_calls_table(results),
         "calls to accuracy": R.calls_to_accuracy_table(results), "branches": R.branching_table(results),
         "matched calls": B.matched_calls_table(results["matched_calls"]),
         "matched calls per pair": B.pair_matched_calls_table(results["matched_calls_per_pair"])}
    beh = HB.behaviour(results, STUDY)
    for split in ("dev", "test"):
        t[f"accuracy {split}"] = R.accuracy_table(results, split)
        t[f"comparison {split}"] = R.comparison_table(results, split)
        t[f"answers by calls {split}"] = HB.behaviour_table(beh, split)
    return t


def _plain(x: str) -> str:
    return x.replace("−", "-").lstrip("+-")


def _allowed(results: dict) -> set[str]:
    nums = {_plain(n) for t in _tables(results).values() for n in NUMBER.findall(t)}
    versions = {n for v in results["provenance"]["packages"].values() for n in NUMBER.findall(str(v or ""))}
    return nums | versions | {"0.2", "0.5", "2.5"}  # zscore's β and τ (the paper's), the 2.5 % tail of a 95 % interval


def test_the_file_holds_what_todays_code_computes(results):
    """hop2-stats rewrote the derived sections with this code: rerun it after changing the statistics."""
    assert results["statistics"] == json.loads(json.dumps(H.statistics(results)))
    st = results["settings"]
    pm = B.pair_matched_calls(results["runs"], H.bootstrap_opts(st))
    assert results["matched_calls_per_pair"] == json.loads(json.dumps(pm))
    assert st["seeds"] == 5 and len(st["methods"]) == 6 and st["select"] == "last"
    assert all(len(rs) == 5 for rs in results["runs"].values())


def test_every_result_table_is_rendered_from_the_committed_json(results, doc):
    section = doc[doc.index(START):doc.index(END)]
    for name, table in _tables(results).items():
        assert table in section, f"docs/branch_rules.md: the {name} table differs from the results file; paste " \
                                 "the output of `arpo experiment hop2-stats --results " \
                                 "docs/results/branch_rules_hop2/results.json`"


def test_every_number_in_the_results_prose_is_from_the_file(results, doc):
    prose = "\n".join(ln for ln in doc[doc.index(START):doc.index(END)].splitlines() if not ln.startswith("|"))
    missing = sorted({n for n in NUMBER.findall(prose) if _plain(n) not in _allowed(results)})
    assert not missing, f"docs/branch_rules.md quotes numbers the hop2 results file does not hold: {missing}"


def test_the_readme_quotes_the_file(results):
    readme = (ROOT / "README.md").read_text()
    bullet = readme[readme.index("- **Branch rules that use the signal**"):readme.index("- **A seed means a run**")]
    missing = sorted({n for n in NUMBER.findall(bullet) if _plain(n) not in _allowed(results)})
    assert not missing, f"README.md's branch-rules bullet quotes numbers the hop2 results file does not hold: {missing}"


def test_the_results_name_the_commit_they_ran_at(results, doc):
    prov = results["provenance"]
    assert not prov["dirty"]
    heading = next(ln for ln in doc.splitlines() if ln.startswith(START))
    assert f"commit {prov['commit'][:7]}" in heading, heading
