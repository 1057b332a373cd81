"""experiments/hop2_stats.py: the statistics section of hop2's results.json, recomputed from the file;
on the pre-fix results (docs/results/hop2_arpo_vs_grpo_pre_fix.json) it gives the numbers issue 38's
review computed, and with per-question records (the re-run, docs/results/hop2_arpo_vs_grpo.json) it adds
the cluster-aware ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments import hop2_stats as H
from experiments import hop2_study as X

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
COMMITTED = RESULTS / "hop2_arpo_vs_grpo.json"
PRE_FIX = RESULTS / "hop2_arpo_vs_grpo_pre_fix.json"  # the study before issue 38's fixes: no per-question records


@pytest.fixture(scope="module")
def committed():
    return json.loads(COMMITTED.read_text())


def test_recompute_on_the_pre_fix_results_keeps_the_raw_data(tmp_path):
    pre_fix = json.loads(PRE_FIX.read_text())
    p = tmp_path / "results.json"
    shutil.copy(PRE_FIX, p)
    assert H.recompute(p) == []  # hop2 rows declare their clusters: none to fill
    again = json.loads(p.read_text())
    assert {k: v for k, v in again.items() if k != "statistics"} == {k: v for k, v in pre_fix.items()
                                                                     if k != "statistics"}
    st = again["statistics"]
    # issue 38: seed-level (permutation over the runs' labels) test p 0.60 (ARPO-GRPO) and 0.40 (AEPO-GRPO)
    assert st["test"]["arpo_vs_grpo"]["seed_level"]["p_permutation"] == pytest.approx(0.6)
    assert st["test"]["aepo_vs_grpo"]["seed_level"]["p_permutation"] == pytest.approx(0.4)
    assert st["test"]["aepo_vs_grpo"]["seed_level"]["p_sign_flip"] == 0.25  # 3 of 3 seeds: the floor
    # the tool-call ratio over seeds and steps is wider than the steps-only one the study reported
    tc = st["tool_calls"]["arpo/grpo"]
    assert tc["two_stage"]["ratio"] == pytest.approx(0.6766, abs=1e-4)
    assert tc["two_stage"]["ci_low"] == pytest.approx(0.628, abs=0.005)
    assert tc["two_stage"]["ci_high"] == pytest.approx(0.722, abs=0.005)
    rep = tc["steps_only_as_reported"]
    assert (round(rep["ci_low"], 3), round(rep["ci_high"], 3)) == (0.652, 0.700)
    assert tc["two_stage"]["ci_high"] - tc["two_stage"]["ci_low"] > 1.5 * (rep["ci_high"] - rep["ci_low"])
    # calls to reach an accuracy (issue 38: 2.63 / 1.65 / 1.32 / 0.86 for ARPO / GRPO)
    lv = st["calls_to_accuracy"]["arpo/grpo"]["levels"]
    assert [round(v["ratio"], 2) for v in lv] == [2.63, 1.65, 1.32, 0.86]
    # no per-question records in the pre-fix file: the cluster-aware numbers are absent, with the reason
    arm = st["dev"]["arpo"]
    assert arm["crossed_bootstrap"] is None and "per_question" in arm["crossed_bootstrap_note"]
    assert st["test"]["arpo_vs_grpo"]["cluster_paired"] is None


def _recs(bits):
    return [{"example_id": f"q{i}", "correct": b, "tool_calls": {"lookup": 2}} for i, b in enumerate(bits)]


def test_with_per_question_records_the_statistics_count_clusters():
    cfg = X.Hop2ExperimentConfig(bootstrap_resamples=200)
    clusters = {"q0": "A", "q1": "A", "q2": "B", "q3": "B"}
    split = X.split_stats({"arpo": [_recs([1, 1, 0, 0]), _recs([1, 1, 0, 1])],
                           "grpo": [_recs([0, 1, 0, 0]), _recs([0, 1, 0, 1])]}, cfg, clusters)
    assert split["per_question"] == {"example_ids": ["q0", "q1", "q2", "q3"], "clusters": ["A", "A", "B", "B"],
                                     "arpo": {"correct": [[1, 1, 0, 0], [1, 1, 0, 1]], "tool_calls": [[2] * 4] * 2},
                                     "grpo": {"correct": [[0, 1, 0, 0], [0, 1, 0, 1]], "tool_calls": [[2] * 4] * 2}}
    s = H.split_section(split, ["arpo", "grpo"], {"n_resamples": 200, "level": 0.95, "seed": 0})
    assert s["arpo"]["crossed_bootstrap"]["clusters"] == 2 and s["arpo"]["crossed_bootstrap"]["mean"] == 5 / 8
    c = s["arpo_vs_grpo"]
    # cluster A: arpo 1, grpo 0.5 (a win); cluster B: both 0.25 (a tie). Per question it is 1 win, 3 ties.
    assert (c["cluster_paired"]["wins"], c["cluster_paired"]["losses"], c["cluster_paired"]["ties"]) == (1, 0, 1)
    assert c["question_paired_as_reported"]["wins"] == 1 and c["crossed_bootstrap_diff"]["diff"] == 0.25
    assert c["seed_level"]["per_seed_diff"] == [0.25, 0.25]



def test_question_clusters_by_hand():
    """hop2_stats.question_cluster: a declared cluster, else the supporting pages (webhop's questions of
    one path, which differ only in the attribute read last), else the question; fill_clusters gives
    them to a file whose every question was its own cluster, and only to such a file."""
    assert H.question_cluster({"id": "q", "cluster": "Belmor/twin", "supporting": ["x"]}) == "Belmor/twin"
    assert H.question_cluster({"id": "q", "supporting": ["Tolk", "Vrain"]}) == "Tolk/Vrain"
    assert H.question_cluster({"id": "q"}) == "q"
    rows = {"dev": [{"id": "a", "supporting": ["T", "V"]}, {"id": "b", "supporting": ["T", "V"]}, {"id": "c"}]}
    results = {"dev": {"per_question": {"example_ids": ["a", "b", "c"], "clusters": ["a", "b", "c"]}},
               "test": {"per_question": {"example_ids": ["a"], "clusters": ["A"]}}}
    assert H.unclustered(results) == ["dev"]
    assert H.fill_clusters(results, rows) == ["dev"]
    assert results["dev"]["per_question"]["clusters"] == ["T/V", "T/V", "c"]
    assert results["dev"]["per_question"]["clusters_from"].startswith("hop2_stats.question_cluster")
    assert results["test"]["per_question"]["clusters"] == ["A"] and H.unclustered(results) == []
    assert H.fill_clusters(results, rows) == []

def test_the_committed_statistics_section_is_what_the_code_computes(committed):
    """docs/results/hop2_arpo_vs_grpo.json carries the section `arpo experiment hop2-stats` writes;
    a change to the statistics must be followed by rerunning it (and updating the doc). The re-run kept
    per-question records, so the cluster-aware numbers are there: every dev and test arm has its
    interval over seeds and clusters, every comparison its per-cluster sign test."""
    assert committed["statistics"] == json.loads(json.dumps(H.statistics(committed)))
    pre_fix = json.loads(PRE_FIX.read_text())
    assert pre_fix["statistics"] == json.loads(json.dumps(H.statistics(pre_fix)))
    st = committed["statistics"]
    for split in ("dev", "test"):
        for arm in ("arpo", "aepo", "grpo"):
            b = st[split][arm]["crossed_bootstrap"]
            assert b is not None and b["clusters"] == 20
            assert b["ci_low"] <= st[split][arm]["accuracy_mean"] <= b["ci_high"]
        for pair in ("arpo_vs_grpo", "aepo_vs_grpo"):
            c = st[split][pair]["cluster_paired"]
            assert c is not None and c["wins"] + c["losses"] + c["ties"] == 20  # hop2's 20 clusters of 3


def test_the_hop2_stats_command_rewrites_the_section_and_prints_the_tables(tmp_path, committed, capsys):
    from arpo.cli import main
    from experiments import hop2_report

    p = tmp_path / "results.json"
    p.write_text(json.dumps({k: v for k, v in committed.items() if k != "statistics"}))
    assert main(["experiment", "hop2-stats", "--results", str(p)]) == 0
    assert json.loads(p.read_text())["statistics"] == committed["statistics"]
    assert capsys.readouterr().out == hop2_report.report(committed)
    assert main(["experiment", "hop2-stats", "--results", str(p), "--out", str(tmp_path / "fig")]) == 0
    assert capsys.readouterr().out == hop2_report.report(committed)
    assert sorted(f.name for f in (tmp_path / "fig").iterdir()) == ["hop2_accuracy.png", "hop2_branching.png"]
    assert main(["experiment", "hop2-stats"]) == 2
    assert "needs --results" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert main(["experiment", "hop2-stats", "--results", str(tmp_path / "bad.json")]) == 2
    assert "not a hop2 results.json" in capsys.readouterr().err


def test_every_arm_keeps_one_distinct_color():
    from experiments.hop2_figures import arm_colors, arm_label

    arms = ["arpo@zscore", "arpo@top_entropy", "arpo@outcome_open", "aepo", "grpo", "arpo"]
    c = arm_colors(arms)
    assert (c["arpo"], c["grpo"], c["aepo"]) == ("tab:red", "tab:blue", "tab:green")  # the presets' own
    assert len(set(c.values())) == len(arms) and c["arpo@zscore"] == "tab:orange"
    assert arm_colors(["x"]) == {"x": "tab:orange"} and arm_label("arpo@top_entropy") == "ARPO@top_entropy"


def test_the_figures_draw_when_no_arm_branched(committed, tmp_path):
    """A run whose arms never branched (GRPO alone, the tiny model's smoke tests) still gets both figures."""
    from experiments.hop2_figures import plot

    res = json.loads(json.dumps(committed))
    for arm in res["branching"].values():
        arm["pooled"].update(branches=0, by_result={})
    assert [p.name for p in plot(res, tmp_path)] == ["hop2_accuracy.png", "hop2_branching.png"]


def test_branching_table_by_hand():
    """Where branches went and whether they changed the outcome, per arm (pooled), with an arm that
    never branched."""
    from experiments.hop2_report import branching_table

    def pooled(branches, decisions, by_result, differs, fresh, rising):
        return {"pooled": {"branches": branches, "branch_decisions": decisions,
                           "branch_rate": branches / decisions if decisions else None, "by_result": by_result,
                           "branch_outcome_differs": differs, "global_pairs_differ": fresh,
                           "entropy_after_results": {t: {"share_rising": r} for t, r in rising.items()}}}

    res = {"branching": {
        "arpo": pooled(8, 16, {"1": {"branches": 6, "branch_outcome_differs": 0.5},
                               "2": {"branches": 2, "branch_outcome_differs": 0.0}}, 0.375, 0.25, {"1": 0.7, "2": 0.2}),
        "grpo": pooled(0, 0, {}, None, 0.3, {"1": 0.6})}}
    lines = branching_table(res).splitlines()
    assert lines[0].count("after result") == 4 and "after result 3" not in lines[0]
    assert lines[2] == "| ARPO | 8 / 16 (0.50) | 6 (75%), 0.50 | 2 (25%), 0.00 | 0.38 | 0.25 | 0.70 | 0.20 |"
    assert lines[3] == "| GRPO | 0 / 0 (–) | – | – | – | 0.30 | 0.60 | – |"
