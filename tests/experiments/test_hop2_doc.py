"""docs/experiment_hop2.md quotes the committed results (issue 38): every result table is the one
hop2_report renders from docs/results/hop2_arpo_vs_grpo.json, and every decimal number in the
results' prose and the Reading is one of those tables' numbers or a named value of the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from experiments import hop2_report

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "experiment_hop2.md"
RESULTS = ROOT / "docs" / "results" / "hop2_arpo_vs_grpo.json"
NUMBER = re.compile(r"(?<![\w.])[+\-−]?\d+\.\d+")


@pytest.fixture(scope="module")
def results():
    return json.loads(RESULTS.read_text())


@pytest.fixture(scope="module")
def doc():
    return DOC.read_text()


def _section(doc: str, start: str, end: str) -> str:
    return doc[doc.index(start):doc.index(end)]


def test_every_result_table_is_rendered_from_the_committed_json(results, doc):
    for name, table in [("runs", hop2_report.runs_table(results)),
                        ("tool calls", hop2_report.tool_calls_table(results)),
                        ("calls to accuracy", hop2_report.calls_to_accuracy_table(results))] + [
            (f"{kind} {split}", fn(results, split)) for split in ("dev", "test")
            for kind, fn in (("accuracy", hop2_report.accuracy_table), ("comparison", hop2_report.comparison_table))]:
        assert table in doc, f"docs/experiment_hop2.md: the {name} table differs from the results file; paste " \
                             "the output of `arpo experiment hop2-stats --results docs/results/hop2_arpo_vs_grpo.json`"


def _plain(x: str) -> str:
    return x.replace("−", "-").lstrip("+-")


def _named_values(results: dict) -> set[str]:
    """Numbers of the file the prose quotes outside the tables, at the precision it quotes them."""
    curves = results["summary"]["curves"]
    vals = [results["sft"]["final_loss"], results["start_dev"]["accuracy"]]
    vals += [c["accuracy_mean"][i] for c in curves.values() for i in range(len(c["step"]))]
    vals += [e["delta_entropy_mean"] for b in results["branching"].values()
             for e in b["pooled"]["entropy_after_results"].values()]
    versions = {n for v in results["provenance"]["packages"].values() for n in NUMBER.findall(str(v or ""))}
    return {f"{v:.{d}f}".lstrip("-") for v in vals for d in (2, 3)} | versions


def test_every_number_in_the_results_prose_is_from_the_file(results, doc):
    allowed = {_plain(n) for n in NUMBER.findall(hop2_report.report(results))} | _named_values(results)
    allowed |= {"2.5"}  # the 2.5 % tail of a 95 % interval, not a result
    prose = _section(doc, "## Results (", "### The branching study") + _section(doc, "### Reading", "### Earlier runs")
    prose = "\n".join(ln for ln in prose.splitlines() if not ln.startswith("|"))  # the tables are checked above
    missing = sorted({n for n in NUMBER.findall(prose) if _plain(n) not in allowed})
    assert not missing, f"docs/experiment_hop2.md quotes numbers the results file does not hold: {missing}"


def test_the_results_name_the_commit_they_ran_at(results, doc):
    """The results heading names the commit of the file's provenance, from a clean tree (issue 38:
    results record the commit)."""
    prov = results["provenance"]
    assert not prov["dirty"]
    heading = next(ln for ln in doc.splitlines() if ln.startswith("## Results ("))
    assert f"commit {prov['commit'][:7]}" in heading, heading


def test_the_readme_and_the_quick_start_page_quote_the_file(results):
    """The README's hop2 bullet and docs/quickstart.md's hop2 table and reading quote only the committed
    results (issue 38: every number in the README's hop2 section matches the committed JSON)."""
    allowed = {_plain(n) for n in NUMBER.findall(hop2_report.report(results))} | _named_values(results)
    allowed |= {_plain(f"{x:.2f}") for x in _calls_ratios(results) if x is not None} | {"0.583"}  # the SFT start
    readme = (ROOT / "README.md").read_text()
    bullet = _section(readme, "- **hop2, ARPO vs AEPO vs GRPO**", "- **webhop")
    page = (ROOT / "docs" / "quickstart.md").read_text()
    block = _section(page, "*Runs of 2026-12-05", "The branching study:")
    missing = sorted({n for n in NUMBER.findall(bullet + block) if _plain(n) not in allowed})
    assert not missing, f"README.md / docs/quickstart.md quote hop2 numbers the results file does not hold: {missing}"
    assert results["start_dev"]["accuracy"] == pytest.approx(0.5833, abs=1e-3)


def _calls_ratios(results: dict) -> list[float]:
    c = results["statistics"]["calls_to_accuracy"]
    return [lv["ratio"] for v in c.values() for lv in v["levels"]] + [
        p["ratio"] for v in c.values() for p in v["per_seed_pair"]]
