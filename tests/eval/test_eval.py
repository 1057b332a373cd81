"""Evaluation metrics, the entropy analysis and plots."""

import json
import math

import pytest

from arpo.analysis.entropy import entropy_by_position, segments
from arpo.eval.evaluate import evaluate, pass_at_k, summarize


def test_pass_at_k_by_hand():
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(5, 1, 1) == pytest.approx(0.2)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))  # 0.7
    assert pass_at_k(4, 3, 2) == 1.0  # n - c < k
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_summarize():
    recs = [{"example_id": e, "correct": c, "score": s, "format_ok": f, "tool_calls": t, "response_tokens": n}
            for e, c, s, f, t, n in [("a", True, 1.0, True, {"python": 1}, 10), ("a", False, 0.0, False, {}, 20),
                                     ("b", False, 0.5, True, {"search": 2}, 30), ("b", False, 0.0, True, {}, 40)]]
    m = summarize(recs, samples=2)
    assert m["pass@1"] == pytest.approx(0.25) and m["pass@2"] == pytest.approx(0.5)
    assert m["score"] == pytest.approx(0.375) and m["format_error_rate"] == pytest.approx(0.25)
    assert m["tool_calls"] == pytest.approx(0.75) and m["tool_calls/search"] == pytest.approx(0.5)
    assert m["response_tokens"] == 25
    assert m["tool_format_rate"] == pytest.approx(0.5)  # a (format ok, python) and b (ok, search)


def test_compare_rows_and_cli(tmp_path, capsys):
    from arpo.cli import main
    from arpo.eval.evaluate import compare

    a = {"results": {"g.jsonl": {"pass@1": 0.25, "score": 0.25, "reward": -0.5, "format_error_rate": 0.5,
                                 "tool_format_rate": 0.25, "tool_calls": 1.0, "response_tokens": 100.0}}}
    b = {"results": {"g.jsonl": {**a["results"]["g.jsonl"], "pass@1": 0.5, "reward": 0.0, "format_error_rate": 0.25}}}
    rows = compare({"sft": a, "arpo": b})
    assert [r["label"] for r in rows] == ["sft", "arpo"] and "delta" not in rows[0]
    assert rows[1]["delta"]["pass@1"] == pytest.approx(0.25) and rows[1]["delta"]["reward"] == pytest.approx(0.5)
    assert rows[1]["delta"]["format_error_rate"] == pytest.approx(-0.25)
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert main(["compare", f"sft={tmp_path / 'a.json'}", f"arpo={tmp_path / 'b.json'}"]) == 0
    out = capsys.readouterr().out
    assert "sft" in out and "(+0.250)" in out and "(-0.250)" in out
    assert main(["compare", str(tmp_path / "missing.json")]) == 2
    assert "no such eval file" in capsys.readouterr().err


def test_evaluate_runs_the_agent_and_scores():
    from arpo.engine.hf import HFEngine
    from arpo.rewards import arpo_reward
    from arpo.testing import scripted_hook, tiny_model, tiny_tokenizer
    from arpo.tools import ToolRegistry

    tok = tiny_tokenizer()
    eng = HFEngine(tiny_model(tok), tok)
    hook = scripted_hook(tok, ["<think> four </think><answer> \\boxed{4} </answer>"])
    orig = eng.add
    eng.add = lambda p, params=None: orig(p, __import__("dataclasses").replace(params, logits_hook=hook))
    exs = [{"id": "q1", "question": "2+2?", "answers": ["4"], "task": "math"},
           {"id": "q2", "question": "2+3?", "answers": ["5"], "task": "math"}]
    recs = []
    m = evaluate(eng, ToolRegistry(), tok, exs, reward_fn=arpo_reward, tool_names=[], records_out=recs)
    assert m["pass@1"] == 0.5 and m["format_error_rate"] == 0.0
    assert [r["correct"] for r in recs] == [True, False]


def test_entropy_by_position_and_plot(tmp_path):
    from arpo.analysis.entropy import plot_entropy

    assert segments([1, 1, 0, 0, 1, 1, 1]) == [(0, 2), (4, 7)]
    recs = [{"parent_id": None, "loss_mask": [1, 1, 0, 1, 1], "entropies": [0.5, 0.3, 0.0, 2.0, 1.0]},
            {"parent_id": 0, "loss_mask": [1, 0, 1], "entropies": [9.0, 0.0, 9.0]}]
    s = entropy_by_position(recs, window=3)
    assert s["trajectories"] == 1 and s["tool_results"] == 1
    assert s["initial"][:2] == [0.5, 0.3] and s["after_tool"][:2] == [2.0, 1.0]
    assert s["initial_first20_mean"] == pytest.approx(0.4) and s["after_tool_first20_mean"] == pytest.approx(1.5)
    assert plot_entropy(s, tmp_path / "e.png").stat().st_size > 1000


def test_plot_run_cli(tmp_path):
    from arpo.cli import main

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "reward_mean": i / 10, "accuracy": 0.1,
                                                                "branches": i}) + "\n" for i in range(1, 5)))
    assert main(["plot", str(tmp_path)]) == 0
    assert {p.name for p in (tmp_path / "plots").iterdir()} >= {"reward.png", "accuracy.png", "branches.png"}
    assert main(["plot", str(tmp_path / "missing")]) == 2


def test_cli_lists_every_command(capsys):
    from arpo.cli import build_parser

    text = build_parser().format_help()
    for c in ("chat", "tool", "index", "serve", "rollout", "sft-data", "sft", "train", "eval", "compare", "plot",
              "analyze"):
        assert c in text
    assert "unavailable" not in text
