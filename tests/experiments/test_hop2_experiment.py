"""experiments/hop2_study.py: the blind protocol's selection and statistics (hand values), and the plumbing
end to end with the tiny random model: dev always, test once and only after the freeze."""

from __future__ import annotations

import json

import pytest

from arpo.data.datasets import load_examples
from arpo.errors import ArpoError
from experiments import hop2_study as X


def _run(curve_accs, calls):
    return {"curve": [{"step": 5 * i, "accuracy": a} for i, a in enumerate(curve_accs)],
            "per_step": [{"tool_calls_issued": c} for c in calls]}


def test_select_steps_best_seed_mean_dev_accuracy_earlier_on_ties():
    runs = {"arpo": [_run([0.1, 0.3, 0.5, 0.4], []), _run([0.1, 0.5, 0.3, 0.6], [])],  # means .4 .4 .5
            "grpo": [_run([0.2, 0.4, 0.4], [])]}  # tie between steps 5 and 10: the earlier
    assert X.select_steps(runs) == {"arpo": 15, "grpo": 5}


def test_split_stats_by_hand():
    def recs(bits, calls=2):
        return [{"example_id": f"q{i}", "correct": b, "tool_calls": {"lookup": calls}} for i, b in enumerate(bits)]

    cfg = X.Hop2ExperimentConfig(bootstrap_resamples=200)
    s = X.split_stats({"arpo": [recs([1, 1, 0, 0]), recs([1, 0, 0, 0])], "grpo": [recs([0, 1, 0, 0], 3),
                                                                                 recs([0, 1, 0, 1], 3)]}, cfg)
    assert s["arpo"]["accuracy_per_seed"] == [0.5, 0.25]
    assert s["arpo"]["accuracy_mean"] == 0.375 and s["arpo"]["accuracy_sd"] == pytest.approx(0.125 * 2 ** 0.5)
    assert s["arpo"]["bootstrap"]["mean"] == 0.375  # per question: 1, .5, 0, 0
    assert s["grpo"]["tool_calls_per_question"] == 3
    # per question arpo (1, .5, 0, 0) vs grpo (0, 1, 0, .5): win q0, losses q1 q3, tie q2
    assert {k: v for k, v in s["paired"]["arpo_vs_grpo"].items() if k not in ("p_sign_test", "unit")} == \
        {"wins": 1, "losses": 2, "ties": 1}


def test_tool_call_ratio_sums_seeds_per_step():
    cfg = X.Hop2ExperimentConfig()
    runs = {"arpo": [_run([0], [3, 3]), _run([0], [3, 3])], "grpo": [_run([0], [4, 4]), _run([0], [8, 8])]}
    r = X.tool_call_ratio(runs, cfg)["arpo/grpo"]
    assert (r["ratio"], r["ci_low"], r["ci_high"]) == (0.5, 0.5, 0.5)  # 6/12 every step


def test_quick_experiment_is_blind_end_to_end(tmp_path):
    out = tmp_path / "q"
    res = X.run(X.Hop2ExperimentConfig.quick(out=str(out), threads=2))
    assert res["test"] is None and set(res["dev"]["selected_steps"]) == {"arpo", "grpo"}
    led = json.loads((out / "protocol.json").read_text())
    assert {e["split"] for e in led["entries"]} == {"dev"} and led["frozen"] is None
    res = X.run(X.Hop2ExperimentConfig.quick(out=str(out), threads=2, report_test=True))  # reuses the runs
    assert res["test"]["arpo"]["bootstrap"]["n"] == 4 and res["sft"]["reused"]
    # the seed- and cluster-aware statistics, from the per-question records the file now keeps
    assert res["test"]["per_question"]["clusters"] == [ex["cluster"] for ex in load_examples("hop2:test[0:4]")]
    st = json.loads((out / "results.json").read_text())["statistics"]
    assert st["test"]["arpo"]["crossed_bootstrap"]["questions"] == 4
    assert st["test"]["arpo_vs_grpo"]["cluster_paired"]["unit"].startswith("question cluster")
    assert set(st["tool_calls"]["arpo/grpo"]) >= {"two_stage", "per_seed", "steps_only_as_reported"}
    assert st["calls_to_accuracy"]["arpo/grpo"]["levels"]
    assert set(json.loads((out / "results.json").read_text())["provenance"]) >= {"commit", "dirty", "packages"}
    assert "Calls to reach an accuracy" in (out / "report.md").read_text()
    led = json.loads((out / "protocol.json").read_text())
    assert [e["split"] for e in led["entries"]][-2:] == ["test", "test"] and led["test_reported_for"]
    with pytest.raises(ArpoError, match="reported once"):
        X.run(X.Hop2ExperimentConfig.quick(out=str(out), threads=2, report_test=True, steps=4))


def test_default_configs_load(tmp_path):
    """The full-size defaults: the SFT overrides and the RL config are valid (caught 'lr' vs 'optim.lr')."""
    from arpo.config import load_config
    from arpo.settings import SFTConfig
    from experiments import common

    cfg = X.Hop2ExperimentConfig()
    sc = load_config(SFTConfig, cfg.sft_config, list(cfg.sft_overrides))
    assert sc.optim.lr == 1e-4 and sc.steps == 8
    tc = common.train_config(cfg, "some/sft", "grpo", 1, tmp_path / "r")
    assert tc.tools.enabled == ["arpo.data.hop2:lookup"] and tc.data.template == "hop2"
    assert tc.algo.preset == "grpo" and tc.run.keep_checkpoints == cfg.keep_checkpoints


def test_the_evaluation_prompt_is_the_training_prompt(tmp_path, monkeypatch):
    """Greedy dev/test evaluation must show the model the prompt RL trains on: before the fix it
    described the plug-in by its spec (`<arpo.data.hop2:lookup> input`), never `<lookup>`, so an SFT
    model that solved 98 % of training rollouts scored 0/60 on dev with 60 format errors."""
    from arpo.data.datasets import load_examples
    from arpo.data.prompts import prompts_for
    from arpo.engine.hf import HFEngine
    from arpo.models import TINY_MODEL, load_model
    from arpo.tools import tools_from_config
    from experiments import common

    seen: list[list[int]] = []
    add = HFEngine.add
    monkeypatch.setattr(HFEngine, "add", lambda self, p, *a, **k: (seen.append(list(p)), add(self, p, *a, **k))[1])
    cfg = X.Hop2ExperimentConfig.quick()
    tc = common.train_config(cfg, TINY_MODEL, "arpo", 0, tmp_path / "r")
    tc.agent.max_response_tokens = 4
    ex = load_examples("hop2:dev[0:2]")
    common.evaluate_model(TINY_MODEL, tc, cfg, ex)
    _, tok = load_model(TINY_MODEL)
    reg = tools_from_config(tc.tools)
    try:
        assert seen == prompts_for(ex, tok, reg, tc.data.template)  # the trainer's rendering
    finally:
        reg.close()
    text = tok.decode(seen[0])
    assert "<lookup>" in text and "arpo.data.hop2" not in text


def test_a_plug_in_spec_is_not_a_tool_name_in_a_prompt():
    from arpo.data.prompts import describe_tool

    with pytest.raises(ArpoError, match="plug-in spec"):
        describe_tool("arpo.data.hop2:lookup")


def test_a_second_command_reuses_the_sft_model_it_trained(tmp_path, monkeypatch):
    """report_test=true after the dev command: the SFT start is the one the RL checkpoints were trained
    from, not a retrained one (issue 38: the JSON's SFT time was the retrain's, 138.5 s vs 161 s)."""
    import arpo.recipes.sft as sft_recipe

    cfg = X.Hop2ExperimentConfig.quick(out=str(tmp_path))
    first = X.make_sft(cfg, tmp_path)
    assert "reused" not in first and first["steps"] == 2

    def no_training(*a, **k):
        raise AssertionError("SFT trained again")

    monkeypatch.setattr(sft_recipe, "run", no_training)
    again = X.make_sft(X.Hop2ExperimentConfig.quick(out=str(tmp_path), report_test=True, threads=1), tmp_path)
    assert again == {**first, "reused": True}
    with pytest.raises(AssertionError, match="trained again"):  # another SFT setting: trained, not reused
        X.make_sft(X.Hop2ExperimentConfig.quick(out=str(tmp_path), sft_overrides=[
            *cfg.sft_overrides, "optim.lr=3e-4"]), tmp_path)


def test_a_study_committed_as_it_runs_goes_on_from_a_fresh_clone(tmp_path, monkeypatch):
    """A study longer than one machine's life (issue 41): select=last fixes the tested step before any
    result, so with report_test=true each run's test is evaluated as the run ends. OUT/.gitignore keeps the
    checkpoints out of git; a fresh clone of the committed directory, in another place, retrains the SFT
    model (the same weights, checked by hash), trains no RL run again and reports the same numbers."""
    import dataclasses
    import shutil
    import subprocess
    from pathlib import Path

    import arpo.recipes.train as train_recipe

    repo = tmp_path / "repo"
    repo.mkdir()
    root = Path(__file__).resolve().parents[2]
    cfg = X.Hop2ExperimentConfig.quick(out=str(repo / "study"), threads=2, select="last", report_test=True,
                                       sft_config=str(root / "configs/sft_quickstart.yaml"),
                                       train_config=str(root / "configs/hop2_rl.yaml"))
    first = X.run(cfg)
    led = json.loads((repo / "study" / "protocol.json").read_text())
    assert led["frozen"]["reason"].startswith("pre-registered") and led["frozen"]["selection"]["steps"] == \
        {"arpo": 2, "grpo": 2}
    for mt in ("arpo", "grpo"):  # tested at the run's end, while its checkpoint was there
        assert (repo / "study" / "rl" / f"{mt}_seed0" / "test_eval" / "heldout_step_000002.json").is_file()

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "study"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "study"], cwd=repo, check=True)
    tracked = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True, check=True).stdout
    assert "checkpoints/" not in tracked and ".safetensors" not in tracked
    assert "study/rl/arpo_seed0/metrics.jsonl" in tracked
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    cfg = dataclasses.replace(cfg, out=str(clone / "study"))  # another place: evaluations match by relative path

    def no_training(*a, **k):
        raise AssertionError("an RL run trained again")

    monkeypatch.setattr(train_recipe, "run", no_training)
    again = X.run(cfg)
    assert not again["sft"].get("reused")  # the SFT model is not in git: trained again, same weights
    assert again["sft"]["weights_sha256"] == first["sft"]["weights_sha256"]
    for split in ("dev", "test"):
        for mt in ("arpo", "grpo"):
            assert again[split][mt]["accuracy_per_seed"] == first[split][mt]["accuracy_per_seed"]

    # an SFT model that comes out different makes the kept runs incomparable: refused, naming the file
    shutil.rmtree(clone / "study" / "sft")
    rec = json.loads((clone / "study" / "sft.json").read_text())
    rec["result"]["weights_sha256"] = "0" * 64
    (clone / "study" / "sft.json").write_text(json.dumps(rec))
    with pytest.raises(ArpoError, match="sft.json: the SFT model trained again here differs") as e:
        X.run(cfg)
    assert "CPU kernels here " in str(e.value) and "ATEN_CPU_CAPABILITY=avx2" in str(e.value)


def test_an_sft_mismatch_names_the_cpu_instructions_of_both_machines():
    from pathlib import Path

    kept = {"weights_sha256": "8af50a1e8196" + "0" * 52}  # a record made before sft.json kept the CPU
    here = {"weights_sha256": "abc76f50d170" + "0" * 52, "cpu": {"capability": "AVX512", "isa_env": {}}}
    msg = X.sft_mismatch(Path("OUT/sft.json"), kept, here)
    assert msg.startswith("OUT/sft.json: the SFT model trained again here differs")
    assert "(weights sha256 abc76f50d170 != 8af50a1e8196; CPU kernels here AVX512, there not recorded)" in msg
    assert ("`ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_CBWR=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`"
            in msg)
    kept["cpu"] = {"capability": "AVX2", "isa_env": {"MKL_CBWR": "AVX2"}}
    assert "CPU kernels here AVX512, there AVX2 with MKL_CBWR=AVX2)" in X.sft_mismatch(Path("s.json"), kept, here)


def test_select_is_dev_or_last(tmp_path):
    with pytest.raises(ArpoError, match="select: 'best'"):
        X.run(X.Hop2ExperimentConfig.quick(out=str(tmp_path), select="best"))


def test_a_run_config_moves_with_its_study_directory():
    from pathlib import Path

    from experiments.common import relocated

    old = {"model": {"name": "/a/b/out/sft/checkpoints/step_000008/model"}, "run": {"dir": "/a/b/out/rl/arpo_seed0"},
           "data": {"path": "hop2:train[120:240]"}, "tools": {"enabled": ["x"]}, "n": 3}
    new = relocated(old, "/a/b/out/rl/arpo_seed0", Path("docs/results/out/rl/arpo_seed0"))
    assert new["model"]["name"] == "docs/results/out/sft/checkpoints/step_000008/model"
    assert new["run"]["dir"] == "docs/results/out/rl/arpo_seed0"
    assert new["data"] == old["data"] and new["n"] == 3
    assert relocated(old, "/a/b/out/rl/arpo_seed0", Path("/a/b/out/rl/arpo_seed0")) == old  # not moved
    assert relocated(old, None, Path("x")) == old


def test_an_sft_stopped_by_a_signal_ends_the_experiment(tmp_path, monkeypatch):
    """SIGTERM during the SFT (it saves a checkpoint and returns) used to let the experiment go on and
    train every RL run from the half-trained SFT model."""
    import arpo.recipes.sft as sft_recipe

    monkeypatch.setattr(sft_recipe, "run", lambda *a, **k: {"model": "m", "steps": 1, "final_loss": 1.0,
                                                            "stopped_by": 15})
    with pytest.raises(KeyboardInterrupt):
        X.make_sft(X.Hop2ExperimentConfig.quick(out=str(tmp_path)), tmp_path)
    assert not (tmp_path / X.SFT_RECORD).exists()
