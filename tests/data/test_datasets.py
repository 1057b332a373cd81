"""Dataset loaders: GSM8K, HotpotQA, FlashRAG, generic JSONL/parquet; errors name file, line, field."""

import json
from pathlib import Path

import pytest

from arpo.data.datasets import load_examples
from arpo.errors import ArpoError

DATA = Path(__file__).resolve().parents[2] / "../shared/data"


def _write(tmp_path, rows, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def test_real_gsm8k_and_hotpotqa():
    g = load_examples(DATA / "gsm8k/train.jsonl", limit=2)
    assert g[0]["task"] == "math" and g[0]["answers"] == ["72"] and "<<48/2=24>>" in g[0]["solution"]
    h = load_examples(DATA / "hotpotqa/train.jsonl", limit=2)
    assert h[0]["task"] == "qa" and h[0]["answers"] == ["October 1922"] and h[0]["id"] == "5abf63f15542997ec76fd3ea"


def test_generic_flashrag_and_parquet(tmp_path):
    p = _write(tmp_path, [{"question": "2+2?", "answer": 4, "task": "math"},
                          {"id": "b1", "question": "Who?", "golden_answers": ["Ann", "Anne"]},  # FlashRAG layout
                          {"question": "Where?", "answers": "Paris"}])
    ex = load_examples(p)
    assert [e["answers"] for e in ex] == [["4"], ["Ann", "Anne"], ["Paris"]]
    assert [e["task"] for e in ex] == ["math", "qa", "qa"] and ex[1]["id"] == "b1" and ex[0]["id"] == "d-1"
    assert [e["task"] for e in load_examples(p, task="math")][1:] == ["math", "math"]  # forced where rows say none
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"question": "q?", "golden_answers": ["a"]}]), tmp_path / "d.parquet")
    assert load_examples(tmp_path / "d.parquet")[0]["answers"] == ["a"]


@pytest.mark.parametrize("row, match", [
    ({"answer": "x"}, r"d.jsonl:2: field 'question' is missing"),
    ({"question": "q"}, r"d.jsonl:2: needs a field 'answer', 'answers' or 'golden_answers'"),
    ({"question": "q", "golden_answers": []}, r"d.jsonl:2: field 'golden_answers' must be a non-empty list"),
    ({"question": "q", "answer": ["a"]}, r"d.jsonl:2: field 'answer' must be a string or number"),
    ({"question": "q", "answer": "a", "task": "code"}, r"d.jsonl:2: field 'task' is 'code'"),
    ("{not json", r"d.jsonl:2: invalid JSON"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, row, match):
    p = _write(tmp_path, [{"question": "ok?", "answer": "y"}, row])
    with pytest.raises(ArpoError, match=match):
        load_examples(p)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ArpoError, match="does not exist"):
        load_examples(tmp_path / "nope.jsonl")
    with pytest.raises(ArpoError, match="no examples"):
        load_examples(_write(tmp_path, ["", "  "]))
