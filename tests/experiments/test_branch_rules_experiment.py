"""`arpo experiment branch-rules` (issue 41): accuracy at matched executed tool calls, hand-computed,
and the whole harness end to end on the tiny random model (plumbing, not a result)."""

import json

import httpx
import pytest

from arpo.errors import ArpoError
from experiments import branch_rules_study as X
from experiments import budget_matched as M


def _curve(*pts):
    return [{"tool_calls": c, "accuracy": a} for c, a in pts]


def test_accuracy_at_interpolates_the_calls_curve():
    curve = _curve((0, 0.5), (40, 0.7), (40, 0.9), (100, 0.6))
    assert M.accuracy_at(curve, 0) == 0.5
    assert M.accuracy_at(curve, 10) == pytest.approx(0.55)  # 0.5 + 0.2·10/40
    assert M.accuracy_at(curve, 40) == pytest.approx(0.7)  # the first segment that holds it
    assert M.accuracy_at(curve, 70) == pytest.approx(0.75)  # 0.9 − 0.3·30/60
    assert M.accuracy_at(curve, 100) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="outside"):
        M.accuracy_at(curve, 101)


def test_matched_calls_reads_every_run_at_the_budget_all_reached():
    runs = {"arpo@top_entropy": [{"curve": _curve((0, 0.5), (60, 0.8))}, {"curve": _curve((0, 0.5), (80, 0.9))}],
            "arpo": [{"curve": _curve((0, 0.5), (100, 0.7))}, {"curve": _curve((0, 0.5), (120, 0.6))}]}
    res = M.matched_calls(runs, [0.5, 1.0], {"n_resamples": 200, "level": 0.95, "seed": 0})
    assert res["c_max"] == 60 and res["base"] == "arpo"  # the smallest final count
    lv = res["levels"][1]
    assert lv["calls"] == 60
    # at 60 calls: 0.8, 0.5 + 0.4·60/80 = 0.8; base: 0.5 + 0.2·0.6 = 0.62, 0.5 + 0.1·0.5 = 0.55
    assert lv["arms"]["arpo@top_entropy"]["accuracy_per_seed"] == pytest.approx([0.8, 0.8])
    assert lv["arms"]["arpo"]["accuracy_per_seed"] == pytest.approx([0.62, 0.55])
    vs = lv["vs_base"]["arpo@top_entropy_vs_arpo"]
    assert vs["diff"] == pytest.approx(0.8 - 0.585) and vs["wins"] == 2 and vs["p_sign_flip"] == 0.5
    assert res["levels"][0]["arms"]["arpo"]["accuracy_per_seed"] == pytest.approx([0.56, 0.525])
    table = M.matched_calls_table(res).splitlines()
    assert table[0] == "| calls (f · C_max) | arpo@top_entropy | arpo |" and len(table) == 4
    assert table[3].startswith("| 60 (1) | 0.800 [") and "Δ +0.215, p 0.50" in table[3]


def test_pair_matched_calls_reads_each_seed_pair_at_its_own_common_budget():
    """A base run that stops calling tools (seed 1: 20 calls) caps its own pair only."""
    runs = {"grpo": [{"curve": _curve((0, 0.5), (100, 0.9))}, {"curve": _curve((0, 0.5), (100, 0.7))}],
            "arpo": [{"curve": _curve((0, 0.5), (50, 0.6))}, {"curve": _curve((0, 0.5), (20, 0.0))}]}
    res = M.pair_matched_calls(runs, {"n_resamples": 200, "level": 0.95, "seed": 0})
    a = res["arms"]["grpo"]
    assert res["base"] == "arpo" and a["calls_per_seed"] == [50, 20]
    # seed 0 at 50 calls: 0.5 + 0.4·0.5 = 0.7 vs 0.6; seed 1 at 20: 0.5 + 0.2·0.2 = 0.54 vs 0.0
    assert a["accuracy_per_seed"] == pytest.approx([0.7, 0.54])
    assert a["base_accuracy_per_seed"] == pytest.approx([0.6, 0.0])
    assert a["vs_base"]["per_seed_diff"] == pytest.approx([0.1, 0.54]) and a["vs_base"]["wins"] == 2
    assert a["vs_base"]["diff"] == pytest.approx(0.32) and a["vs_base"]["p_sign_flip"] == 0.5
    assert a["diff_seed_bootstrap"]["mean"] == pytest.approx(0.32)
    assert 0.1 - 1e-9 <= a["diff_seed_bootstrap"]["ci_low"] <= a["diff_seed_bootstrap"]["ci_high"] <= 0.54 + 1e-9
    table = M.pair_matched_calls_table(res).splitlines()
    assert table[0].startswith("| arm vs arpo | per seed pair: C_s, arm vs base |") and len(table) == 3
    assert table[2].startswith("| grpo | 50: 0.700 vs 0.600; 20: 0.540 vs 0.000 | +0.320 | [")
    assert table[2].endswith("| 2 / 0 | 0.50 |")


def test_webhop_takes_its_data_sft_and_rl_config():
    cfg = X.with_task(X.BranchRulesConfig(task="webhop"))
    assert (cfg.eval_data, cfg.test_data, cfg.train_config) == ("webhop:dev", "webhop:test",
                                                                "examples/deep_search/train.yaml")
    assert (cfg.sft_config, cfg.sft_data, cfg.sft_overrides) == ("examples/deep_search/sft.yaml",
                                                                 "webhop:train[0:120]", [])
    assert X.with_task(X.BranchRulesConfig(task="webhop", eval_data="webhop:dev[0:4]")).eval_data == "webhop:dev[0:4]"
    with pytest.raises(ArpoError, match="task: 'web'"):
        X.with_task(X.BranchRulesConfig(task="web"))
    assert X.own_web_url(X.BranchRulesConfig(train_overrides=["tools.web.url = http://h:1", "steps=2"])) == "http://h:1"
    assert X.own_web_url(X.BranchRulesConfig()) is None


def test_quick_webhop_serves_its_web_and_resumes(tmp_path):
    """task=webhop on the tiny random model: the experiment serves the local web itself (a real `arpo
    web serve` process, gone when the run ends), makes the scripted trajectories through it (their URLs
    name its port), trains the SFT start and RL against it; run again, it serves the web again and
    reuses the SFT model and every run."""
    from arpo.ports import free_port

    out, port = tmp_path / "w", free_port()
    over = dict(task="webhop", out=str(out), threads=1, sft_data="webhop:train[0:4]", eval_data="webhop:dev[0:2]",
                test_data="webhop:test[0:2]", methods=["arpo@top_entropy", "arpo"], select="last", report_test=True,
                web_port=port)
    quick = X.BranchRulesConfig.quick(**over)
    quick.train_overrides = [*quick.train_overrides, "model.train_layers=0"]  # the tiny model has 2 layers
    res = X.run(quick)
    rows = [json.loads(line) for line in (out / "sft_webhop.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(f"<browse>http://127.0.0.1:{port}/wiki/" in r["response"] for r in rows)
    assert res["sft"]["rows"] == 4 and not res["sft"].get("reused")
    url = next(o for o in res["settings"]["train_overrides"] if o.startswith("tools.web.url="))
    run_dir = out / "rl" / "arpo_seed0"
    assert url.partition("=")[2] in (run_dir / "config.yaml").read_text()
    with pytest.raises(httpx.HTTPError):  # the server is gone with the run
        httpx.get(url.partition("=")[2] + "/health", timeout=2)
    assert res["test"] is not None and set(res["test"]) >= {"arpo@top_entropy", "arpo"}
    mtime = (run_dir / "metrics.jsonl").stat().st_mtime
    again = X.run(quick)
    assert again["sft"].get("reused") and (run_dir / "metrics.jsonl").stat().st_mtime == mtime
    assert again["test"]["arpo"]["accuracy_mean"] == res["test"]["arpo"]["accuracy_mean"]


def test_arms_name_a_preset_and_a_branch_rule(tmp_path):
    from experiments import common

    cfg = X.BranchRulesConfig()
    assert cfg.methods[-1] == "arpo" and cfg.seeds >= 5
    tc = common.train_config(cfg, "some/sft", "arpo@outcome_open", 1, tmp_path / "r")
    assert tc.algo.preset == "arpo" and tc.rollout.branch_rule == "outcome_open"
    assert common.train_config(cfg, "some/sft", "grpo", 1, tmp_path / "r").rollout.branch_rule == "auto"


def test_quick_branch_rules_experiment_end_to_end(tmp_path, capsys):
    """Two arms (a staged rule and the paper's), one seed (the study: >= 5), one step: the hop2
    pipeline's statistics, branch placement per arm, the matched-calls section, a dev-only ledger."""
    out = tmp_path / "q"
    res = X.run(X.BranchRulesConfig.quick(out=str(out), threads=1, sampled=2))
    assert res["test"] is None and set(res["dev"]["selected_steps"]) == {"arpo@top_entropy", "arpo"}
    saved = json.loads((out / "results.json").read_text())
    # sampled=2: the sampled policy's pass@1 (2 answers per question at the training temperature) beside greedy
    start, point = saved["start_dev"], saved["runs"]["arpo"][0]["curve"][-1]
    assert {"sampled_accuracy", "sampled_format_error_rate"} <= set(start) & set(point)
    assert 0 <= start["sampled_accuracy"] <= 1 and start["sampled_format_error_rate"] == 1.0  # the random model
    mc = saved["matched_calls"]
    assert mc["base"] == "arpo" and [lv["fraction"] for lv in mc["levels"]] == [0.25, 0.5, 0.75, 1.0]
    assert len(mc["levels"][-1]["arms"]["arpo@top_entropy"]["accuracy_per_seed"]) == 1
    assert "arpo@top_entropy_vs_arpo" in saved["statistics"]["dev"]
    assert "arpo@top_entropy/arpo" in saved["statistics"]["calls_to_accuracy"]
    assert set(saved["branching"]) == {"arpo@top_entropy", "arpo"}
    assert "by_result" in saved["branching"]["arpo"]["pooled"]
    assert "Accuracy at matched executed tool calls" in (out / "report.md").read_text()
    led = json.loads((out / "protocol.json").read_text())
    assert {e["split"] for e in led["entries"]} == {"dev"}
    assert any(e["name"] == "arpo@top_entropy/accuracy_at_matched_calls" for e in led["entries"])
    # hop2-stats on it (what the doc quotes): the tables, the matched calls, what the runs' answers took
    from arpo.cli import main

    assert main(["experiment", "hop2-stats", "--results", str(out / "results.json")]) == 0
    printed = capsys.readouterr().out
    assert M.matched_calls_table(mc) in printed
    pm = json.loads((out / "results.json").read_text())["matched_calls_per_pair"]
    assert pm == json.loads(json.dumps(saved["matched_calls_per_pair"]))  # hop2-stats recomputes it the same
    assert M.pair_matched_calls_table(pm) in printed and "Branches (training rollouts" in printed
    assert "Answers by tool calls, dev" in printed and "| arpo@top_entropy | 0 |" in printed


def test_the_command_builds_the_config_and_prints_the_matched_calls(monkeypatch, capsys):
    """`arpo experiment branch-rules --quick ...` reaches branch_rules.run with the quick config and the
    overrides, and prints the matched-calls section (the run itself is the test above)."""
    from arpo.cli import main

    seen = {}

    def fake(cfg):
        seen["cfg"] = cfg
        return {"wall_seconds": 1.0, "start_dev": {}, "dev": {}, "test": None, "matched_calls": {"c_max": 7.0}}

    monkeypatch.setattr(X, "run", fake)
    assert main(["experiment", "branch-rules", "--quick", "--seeds", "3", "--out", "/tmp/x",
                 "methods=[arpo@zscore,grpo]"]) == 0
    cfg = seen["cfg"]
    assert isinstance(cfg, X.BranchRulesConfig) and cfg.seeds == 3 and cfg.out == "/tmp/x"
    assert cfg.methods == ["arpo@zscore", "grpo"] and cfg.sft_overrides[0] == "model.name=tiny-random"
    assert json.loads(capsys.readouterr().out)["matched_calls"] == {"c_max": 7.0}
