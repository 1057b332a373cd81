"""examples/openenv_counter: the counter OpenEnv server's rules (hand-computed observations and rewards),
make_sft.py's worked trajectories played on the real server (exact text), and run.sh's whole pipeline
(sft data -> SFT -> eval -> ARPO -> eval -> compare) on a tiny random model."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv.core")

from arpo.envs.spec import close_all, iter_rows
from arpo.tools.plugins.env import env_tool

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples" / "openenv_counter"
SPEC = "openenv:examples.openenv_counter.counter_env:app"
PROMPT_1 = ("Reach exactly 30 by adding whole numbers from 1 to 9, one per <env> call: write <env> N </env>. "
            "The total starts at 7. When it is 30, answer <answer> \\boxed{30} </answer>.")


@pytest.fixture(scope="module")
def at_root():
    """arpo starts the example's server from the repository root (its module path is under it)."""
    mp = pytest.MonkeyPatch()
    mp.chdir(ROOT)
    mp.syspath_prepend(str(ROOT))
    yield
    close_all()
    mp.undo()


def test_the_tasks_are_seeded_and_the_held_out_ones_are_new():
    from examples.openenv_counter.counter_env import task

    assert [task(s) for s in range(5)] == [(0, 10), (7, 30), (14, 29), (21, 49), (3, 23)]  # S = 7s mod 25
    assert sorted({t - s for s, t in map(task, range(5000, 5021))}) == list(range(10, 31))  # 2 to 4 additions

    def tasks(seeds):
        return {task(s) for s in seeds}

    held_out = tasks(range(5000, 5100))  # run.sh's seed ranges: held-out, SFT and RL tasks are distinct
    assert len(held_out) == 100 and not held_out & (tasks(range(200)) | tasks(range(1000, 1200)))


def test_the_servers_rules(at_root):
    rows = [r for _, r in iter_rows(f"{SPEC}?n=2&seed=0")]
    assert rows[1]["question"] == PROMPT_1 and rows[1]["env"]["reset"] == {"seed": 1}
    t = env_tool(SPEC)
    t.bind("a", rows[1])  # from 7 to 30
    seen = [(r.output, r.meta) for r in (t.run_session("a", a) for a in ("9", "twelve", "0", "10", "9", "4"))]
    assert seen == [
        ("total 16 (need 14 more)", {"env_reward": None, "env_done": False}),
        ("Error: write one whole number from 1 to 9, not 'twelve'; total 16 (need 14 more)",
         {"env_reward": None, "env_done": False}),  # a bad action: an error observation, the episode goes on
        ("Error: write one whole number from 1 to 9, not '0'; total 16 (need 14 more)",
         {"env_reward": None, "env_done": False}),
        ("Error: write one whole number from 1 to 9, not '10'; total 16 (need 14 more)",
         {"env_reward": None, "env_done": False}),
        ("total 25 (need 5 more)", {"env_reward": None, "env_done": False}),
        ("total 29 (need 1 more)", {"env_reward": None, "env_done": False}),
    ]
    assert t.run_session("a", "2").output == "total 31: past 30, failed"  # overshoot: reward 0, done
    t.bind("b", rows[0])  # target 10
    assert [(r.output, r.meta["env_reward"], r.meta["env_done"]) for r in (t.run_session("b", a) for a in "73")] == [
        ("total 7 (need 3 more)", None, False), ("total 10: exactly 10, done", 1.0, True)]
    assert "the episode is over" in t.run_session("b", "1").output
    t.fork("a", "c", 5)  # a fork after a's 5th call continues its episode at total 25: replayed on the server
    assert t.run_session("c", "5").meta == {"env_reward": 1.0, "env_done": True}
    assert t.stats["replays"] == 1
    t.close()


def test_make_sft_plays_the_greedy_strategy_on_the_server(at_root):
    from arpo.data.prompts import prompts_for
    from arpo.sft.rows import tokenize_row
    from arpo.testing import tiny_tokenizer
    from arpo.tools import build_tools
    from examples.openenv_counter.make_sft import greedy_action, make_rows

    assert [greedy_action(m) for m in (23, 10, 9, 5, 1)] == [9, 9, 9, 5, 1]
    rows = make_rows(2, 3)  # seeds 3 and 4: from 21 to 49, from 3 to 23
    assert rows[0]["response"] == (
        "<env> 9 </env>\n<result>\ntotal 30 (need 19 more)\n</result>\n"
        "<env> 9 </env>\n<result>\ntotal 39 (need 10 more)\n</result>\n"
        "<env> 9 </env>\n<result>\ntotal 48 (need 1 more)\n</result>\n"
        "<env> 1 </env>\n<result>\ntotal 49: exactly 49, done\n</result>\n"
        "<answer> \\boxed{49} </answer>")
    assert rows[1]["response"] == (
        "<env> 9 </env>\n<result>\ntotal 12 (need 11 more)\n</result>\n"
        "<env> 9 </env>\n<result>\ntotal 21 (need 2 more)\n</result>\n"
        "<env> 2 </env>\n<result>\ntotal 23: exactly 23, done\n</result>\n"
        "<answer> \\boxed{23} </answer>")
    r = rows[1]
    assert [r["response"][a:b] for a, b in r["tool_results"]] == [
        "\n<result>\ntotal 12 (need 11 more)\n</result>\n", "\n<result>\ntotal 21 (need 2 more)\n</result>\n",
        "\n<result>\ntotal 23: exactly 23, done\n</result>\n"]
    assert r["answers"] == ["23"] and r["id"] == f"{SPEC}#1" and r["task"] == "qa"
    assert "<env> action </env>" in r["system_prompt"] and r["tool_format"] == "tags"
    assert r["tools"][0]["function"]["name"] == "env"
    # arpo sft's prompt for the row is the one the rollout and eval render (prompts_for), token for token
    tok, reg = tiny_tokenizer(), build_tools([SPEC])
    try:
        rendered = prompts_for(rows, tok, reg, None)
    finally:
        reg.close()
    for row, want in zip(rows, rendered, strict=True):
        prompt, ids, mask = tokenize_row(tok, row)
        assert prompt == want
        assert 0 < sum(mask) < len(ids)  # the result blocks are masked out, the model's text is not


def test_run_sh_runs_the_whole_pipeline_on_a_tiny_model(tmp_path):
    from arpo.testing import save_tiny_model

    model = save_tiny_model(tmp_path / "tiny")
    arpo_bin = tmp_path / "arpo"
    arpo_bin.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m arpo "$@"\n')
    arpo_bin.chmod(arpo_bin.stat().st_mode | stat.S_IEXEC)
    q = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "ARPO_BIN": str(arpo_bin), "ARPO_PYTHON": sys.executable, "ARPO_RUN_DIR": str(q), "SFT_ROWS": "4",
           "HELDOUT_N": "2", "SFT_OVERRIDES": f"model.name={model} steps=1 prompts_per_step=2 data.max_seq_len=4096",
           "TRAIN_OVERRIDES": "steps=1 prompts_per_step=2 agent.max_response_tokens=24 rollout.group_size=2 "
                              "rollout.initial_rollouts=1",
           "EVAL_FLAGS": "--max-response-tokens 16"}
    env["SEEDS"] = "7 8"
    p = subprocess.run(["bash", str(EX / "run.sh")], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-4000:])
    assert "[openenv_counter]" in p.stdout and "ARPO seed 8" in p.stdout and "done" in p.stdout
    sft = [json.loads(x) for x in (q / "sft_data.jsonl").read_text().splitlines()]
    assert [r["id"] for r in sft] == [f"{SPEC}#{i}" for i in range(4)]  # seeds 0..3
    for name in ("eval_sft.json", "eval_sft_t1.json", "eval_arpo_s7.json", "eval_arpo_s8_t1.json"):
        res = json.loads((q / name).read_text())["results"]
        (key,) = res
        assert key == f"{SPEC}?n=2&seed=5000" and res[key]["questions"] == 2, res
    run_cfg = (q / "arpo_s8" / "config.yaml").read_text()
    assert "seed: 8" in run_cfg and "seed=1000" in run_cfg  # the run seed, and RL's task seeds
    assert json.loads((q / "compare_s7.json").read_text())
    res = json.loads((q / "results.json").read_text())
    assert res["seeds"] == 2 and res["start"]["questions"] == 2 and "sampled_pass@1" in res["runs"][0]
