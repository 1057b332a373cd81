"""examples/sql with a tiny random model: the documented pipeline (sft-data tools -> sft -> eval ->
train -> eval) runs with the plug-in class tool, in both call formats for the data."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = "examples.sql.sql_tool:Sql"


def test_sql_tool_is_a_stateful_class_tool():
    from arpo.tools import build_tools

    reg = build_tools([TOOL])
    t = reg["sql"]
    assert "customers(id, name, city)" in t.description
    assert t.call({"query": "SELECT COUNT(*) FROM customers"}).output == "20"
    bad = t.call({"query": "DROP TABLE orders"})
    assert not bad.ok and "only one SELECT" in bad.output
    reg.close()
    assert t.owner.db is not None  # closed by close(): a closed sqlite connection refuses queries
    import sqlite3

    with pytest.raises(sqlite3.ProgrammingError):
        t.owner.db.execute("SELECT 1")


def test_the_example_pipeline_runs_with_a_tiny_model(tmp_path, monkeypatch, capsys):
    from arpo.cli import main
    from arpo.testing import save_tiny_model

    monkeypatch.chdir(ROOT)  # the tool spec is a module path under the repository root
    model = save_tiny_model(tmp_path / "tiny")
    sft_data = tmp_path / "sft.jsonl"
    assert main(["sft-data", "tools", "--data", "examples/sql/train.jsonl", "--tools", TOOL, "--limit", "8",
                 "--out", str(sft_data), "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["written"] == 8
    assert main(["sft-data", "tools", "--data", "examples/sql/train.jsonl", "--tools", TOOL, "--limit", "2",
                 "--tool-format", "json", "--model", model, "--out", str(tmp_path / "j.jsonl"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["sft", f"model.name={model}", f"data.path=[{sft_data}]", "prompts_per_step=2", "steps=2",
                 f"run.dir={tmp_path / 'sft'}", "run.tensorboard=false", "--quiet", "--json"]) == 0
    capsys.readouterr()
    assert main(["train", "--config", "examples/sql/train.yaml", f"model.name={tmp_path / 'sft'}", "steps=1",
                 "prompts_per_step=2", "agent.max_response_tokens=24", f"run.dir={tmp_path / 'arpo'}",
                 "--quiet", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["final"]["trajectories"] == 8
    assert main(["eval", "--model", str(tmp_path / "arpo"), "--data", "examples/sql/heldout.jsonl", "--limit", "2",
                 "--tools", TOOL, "--max-response-tokens", "24", "--out", str(tmp_path / "e.json"), "--quiet",
                 "--json"]) == 0
    res = json.loads((tmp_path / "e.json").read_text())
    assert res["results"]["examples/sql/heldout.jsonl"]["tools"] == ["sql"]


def test_a_right_answer_with_the_plug_in_tool_scores_1(tiny_lm, tiny_tok, monkeypatch):
    """A plug-in tool's tag is a call for the reward's format gate: a correct `<sql>` answer through
    eval is pass@1 1 (it was a format error, reward -1, so RL on examples/ could never learn)."""
    from arpo.data.datasets import load_examples
    from arpo.engine.hf import HFEngine
    from arpo.eval.evaluate import evaluate
    from arpo.rewards import arpo_reward
    from arpo.rollout.agent import AgentLoop
    from arpo.settings import AgentConfig
    from arpo.testing import scripted_hook
    from arpo.tools import build_tools

    monkeypatch.chdir(ROOT)
    ex = load_examples("examples/sql/heldout.jsonl")[0]
    reg = build_tools([TOOL])
    gold = ex["answers"][0]
    query = reg["sql"].call({"query": "SELECT 1"})  # the tool works
    assert query.ok
    script = ["<think> look it up </think>\n<sql>SELECT '" + gold.replace("'", "''") + "'</sql>",
              f"\n<think> found </think>\n<answer> \\boxed{{{gold}}} </answer>"]
    params = AgentLoop.params
    monkeypatch.setattr(AgentLoop, "params", lambda self, n, seed: (lambda p: (
        setattr(p, "logits_hook", scripted_hook(self.tok, script)), p)[1])(params(self, n, seed)))
    try:
        m = evaluate(HFEngine(tiny_lm, tiny_tok), reg, tiny_tok, [ex], reward_fn=arpo_reward,
                     agent=AgentConfig(max_response_tokens=200), template="math")
    finally:
        reg.close()
    assert (m["pass@1"], m["format_error_rate"], m["tool_calls"]) == (1.0, 0.0, 1.0)
    # the same text without the tool's tag among the available ones breaks the protocol
    text = script[0] + f"\n<result>\n{gold}\n</result>\n" + script[1]
    assert arpo_reward(text, ex, tools=["sql"]).reward == 1.0
    assert arpo_reward(text, ex).format_error == "<result> that does not follow a tool call"
