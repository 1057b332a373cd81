"""Cold-start SFT rows: real tool outputs, valid protocol (spec §5.1), exact result spans."""

import json

import pytest

from arpo.data.datasets import load_examples
from arpo.rewards import arpo_reward
from arpo.rewards.format import check_format
from arpo.sft.convert import gsm8k_to_sft, hotpotqa_to_sft
from arpo.sft.rows import result_spans


@pytest.fixture(scope="module")
def python_tool():
    from arpo.tools.python import PythonTool

    t = PythonTool()
    yield t
    t.close()


def test_gsm8k_rows_are_real_and_valid(python_tool):
    exs = load_examples("gsm8k:train", limit=8)
    rows = [r for r, _ in (gsm8k_to_sft(e, python_tool, style="stepwise") for e in exs) if r]
    assert len(rows) >= 6
    for r in rows:
        assert check_format(r["response"]) is None
        assert arpo_reward(r["response"], r, tool_calls=[{"tool": "python"}]).reward == 1.0
        assert [list(s) for s in result_spans(r["response"])] == r["tool_results"]
        for s, e in r["tool_results"]:
            block = r["response"][s:e]
            assert block.startswith("\n<result>\n") and block.endswith("\n</result>\n")
    first = rows[0]["response"]  # Natalia: 48/2 then 48+24, one call per solution line, run for real
    assert first.count("<python>") == 2 and "print(48/2)" in first and "<result>\n24.0\n</result>" in first
    thought = first.split("</think>")[0]
    assert "48/2" in thought and "24" not in thought  # the result is not known before the call


def test_gsm8k_single_program_style(python_tool):
    ex = load_examples("gsm8k:train", limit=1)[0]
    r, why = gsm8k_to_sft(ex, python_tool, style="single")
    assert why == "ok" and r["response"].count("<python>") == 1 and "\n24.0\n72\n" in r["response"]


def test_gsm8k_merges_lines_to_max_calls(python_tool):
    sol = "a <<1+1=2>>2\nb <<2+1=3>>3\nc <<3+1=4>>4\nd <<4+1=5>>5\n#### 5"
    r, why = gsm8k_to_sft({"id": "m", "question": "q", "solution": sol}, python_tool, max_calls=2, style="stepwise")
    assert why == "ok" and r["response"].count("<python>") == 2 and "print(1+1)\nprint(2+1)" in r["response"]
    assert arpo_reward(r["response"], r, tool_calls=[{"tool": "python"}]).reward == 1.0


def test_gsm8k_drops_mismatches(python_tool):
    ex = {"id": "x", "question": "q", "solution": "2+2 = <<2+2=5>>5\n#### 5", "answers": ["5"]}
    assert gsm8k_to_sft(ex, python_tool, style="stepwise") == (None, "program output != annotation")
    ex = {"id": "y", "question": "q", "solution": "2+2 = <<2+2=4>>4\n#### 5", "answers": ["5"]}
    assert gsm8k_to_sft(ex, python_tool, style="stepwise") == (None, "program output != gold answer")
    assert gsm8k_to_sft(ex, python_tool, style="single") == (None, "program output != gold answer")


def test_hotpotqa_row_with_fake_search():
    row = {"id": "h", "question": "Which city?", "answer": "Paris",
           "supporting_facts": {"title": ["France", "France", "Seine"], "sent_id": [0, 1, 0]}}
    r, why = hotpotqa_to_sft(row, lambda q: f"Page 1: {q}\n{q} is near Paris.")
    assert why == "ok" and r["response"].count("<search>") == 2  # duplicate titles searched once
    assert check_format(r["response"]) is None
    assert arpo_reward(r["response"], r).reward == 1.0
    assert hotpotqa_to_sft(row, lambda q: "nothing")[1] == "answer not in search results"


def test_cli_writes_rows(tmp_path):
    from arpo.cli import main

    out = tmp_path / "s.jsonl"
    assert main(["sft-data", "gsm8k", "--data", "gsm8k:train", "--limit", "3", "--out", str(out),
                 "--quiet"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["system"] == "math" for r in rows)


def test_rejection_rows_keep_rewarded_samples_only():
    from arpo.sft.convert import rejection_rows

    good = ("<think> a </think>\n<python>\nprint(2)\n</python>\n<result>\n2\n</result>\n"
            "<answer> \\boxed{2} </answer><|im_end|>")
    exs = {"q": {"id": "q", "task": "math", "question": "1+1?", "answers": ["2"]}}
    recs = [{"example_id": "q", "reward": -1.0, "text": "junk"}, {"example_id": "q", "reward": 1.0, "text": good},
            {"example_id": "q", "reward": 1.0, "text": good}]
    rows = rejection_rows(recs, exs)
    assert len(rows) == 1 and rows[0]["response"].endswith("</answer>")
    s, e = rows[0]["tool_results"][0]
    assert rows[0]["response"][s:e] == "\n<result>\n2\n</result>\n"
    assert check_format(rows[0]["response"]) is None
