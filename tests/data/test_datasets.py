"""Dataset loaders: built-in names, Hugging Face datasets, GSM8K, HotpotQA, SVAMP, FlashRAG, generic
JSONL(.gz)/parquet and globs; errors name file, line, field."""

import json
from pathlib import Path

import pytest

from arpo.data.datasets import load_examples
from arpo.errors import ArpoError


def _write(tmp_path, rows, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def test_real_gsm8k_hotpotqa_and_svamp_ship_inside_arpo():
    g = load_examples("gsm8k:train", limit=2)
    assert g[0]["task"] == "math" and g[0]["answers"] == ["72"] and "<<48/2=24>>" in g[0]["solution"]
    h = load_examples("hotpotqa:train", limit=2)
    assert h[0]["task"] == "qa" and h[0]["answers"] == ["October 1922"] and h[0]["id"] == "5abf63f15542997ec76fd3ea"
    s = load_examples("svamp:train", limit=1)[0]
    # floats that are integers read as a model writes them; the python expression is kept for SFT data
    assert s == {"id": "svamp:train-1", "question": s["question"], "answers": ["504"], "task": "math",
                 "equation": "( 56 * 9 )"} and "56 books" in s["question"]
    t = load_examples("svamp:test", limit=1)[0]
    assert t["id"] == "chal-1" and t["answers"] == ["51"]
    from arpo.data.sources import BUILTIN_DIR

    assert BUILTIN_DIR.is_relative_to(Path(__import__("arpo").__file__).parent)  # inside the package


@pytest.mark.parametrize("name, rows", [("gsm8k:train", 7473), ("gsm8k:test", 1319), ("hotpotqa:train", 300),
                                        ("hotpotqa:dev", 300), ("hotpotqa:test", 500), ("svamp:train", 3123),
                                        ("svamp:test", 700)])
def test_builtin_row_counts_and_licenses(name, rows):
    from arpo.data.sources import data_files

    (f,) = data_files(name)
    assert len(load_examples(name)) == rows
    lic = (f.parent / "LICENSE").read_text()
    assert ("MIT License" in lic) or ("CC BY-SA 4.0" in lic and "HotpotQA" in lic)


def test_builtin_name_errors_and_all_splits():
    from arpo.data.sources import data_files

    with pytest.raises(ArpoError, match=r"no split 'dev'; choose svamp:train, svamp:test"):
        load_examples("svamp:dev")
    assert [f.name for f in data_files("hotpotqa")] == ["train.jsonl.gz", "dev.jsonl.gz", "test.jsonl.gz"]
    with pytest.raises(ArpoError, match=r"does not exist \(built-in datasets: gsm8k:train"):
        load_examples("gsm8k_train.jsonl")


def test_row_slices():
    whole = load_examples("svamp:train", limit=30)
    part = load_examples("svamp:train[20:25]")
    assert part == whole[20:25] and part[0]["id"] == "svamp:train-21"
    assert load_examples("svamp:train[3120:]")[-1]["id"] == "svamp:train-3123"
    with pytest.raises(ArpoError, match="empty row range"):
        load_examples("svamp:train[5:5]")


@pytest.mark.parametrize("limit", [0, -1])
def test_limit_below_one_is_an_error(limit):
    with pytest.raises(ArpoError, match="limit must be >= 1"):
        load_examples("svamp:test", limit=limit)


def test_gzip_and_glob(tmp_path):
    import gzip

    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b'{"question": "q1", "answer": "1"}\n'))
    _write(tmp_path, [{"question": "q2", "answer": "2"}], "b.jsonl")
    ex = load_examples(str(tmp_path / "*.jsonl*"))
    assert [e["answers"] for e in ex] == [["1"], ["2"]] and ex[0]["id"] == "a-1"
    with pytest.raises(ArpoError, match="no file matches"):
        load_examples(str(tmp_path / "*.csv"))
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(ArpoError, match="bad.jsonl.gz cannot be read"):
        load_examples(tmp_path / "bad.jsonl.gz")


def test_hugging_face_datasets_saved_locally(tmp_path):
    """hf:NAME[:CONFIG]:SPLIT through the `datasets` library, on local data (no hub access)."""
    datasets = pytest.importorskip("datasets")
    d = datasets.DatasetDict({
        "train": datasets.Dataset.from_list([{"problem": "1+1?", "solution": "2"},
                                             {"problem": "2+3?", "solution": "5"}]),
        "test": datasets.Dataset.from_list([{"problem": "3+3?", "solution": "6"}]),
    })
    d.save_to_disk(str(tmp_path / "saved"))
    ex = load_examples(f"hf:{tmp_path / 'saved'}:train?question=problem&answer=solution", task="math")
    assert [(e["question"], e["answers"], e["task"]) for e in ex] == [("1+1?", ["2"], "math"), ("2+3?", ["5"], "math")]
    # a parquet folder in the hub's layout loads with load_dataset
    (tmp_path / "pq" / "data").mkdir(parents=True)
    d["test"].to_parquet(str(tmp_path / "pq" / "data" / "test-00000-of-00001.parquet"))
    ex = load_examples(f"hf:{tmp_path / 'pq'}:test?question=problem&answer=solution")
    assert ex[0]["answers"] == ["6"] and ex[0]["id"].endswith("pq:test-1")
    with pytest.raises(ArpoError, match="no column 'query' for question="):
        load_examples(f"hf:{tmp_path / 'saved'}:train?question=query&answer=solution")
    with pytest.raises(ArpoError, match="no split 'dev'"):
        load_examples(f"hf:{tmp_path / 'saved'}:dev")
    with pytest.raises(ArpoError, match="expected hf:NAME:SPLIT"):
        load_examples("hf:justaname")
    with pytest.raises(ArpoError, match="unknown field option"):
        load_examples(f"hf:{tmp_path / 'saved'}:train?quest=problem")


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


def test_sliced_builtin_names_are_builtin_labels():
    from arpo.commands.eval import _label
    from arpo.data.sources import is_builtin

    assert is_builtin("svamp:test[0:200]") and _label("svamp:test[0:200]") == "svamp:test[0:200]"
    assert not is_builtin("svamp:nope") and not is_builtin("x.jsonl")


def test_a_row_slice_past_the_end_says_how_many_rows_there_are():
    """examples/deep_search/run.sh asked for hotpotqa:train[300:302] of its 300 rows: a bare 'no examples'."""
    with pytest.raises(ArpoError, match=r"starts past the end of hotpotqa:train, which has 300 rows \(0\.\.299\)"):
        load_examples("hotpotqa:train[300:302]")
    assert len(load_examples("hotpotqa:train[298:302]")) == 2  # a slice may end past the end, as in Python


def test_a_row_may_declare_its_cluster(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"question": "q1", "answer": "1", "cluster": "town/twin"}\n{"question": "q2", "answer": "2"}\n'
                 '{"question": "q3", "answer": "3", "cluster": 7}\n')
    ex = load_examples(str(p), task="qa")
    assert [e.get("cluster") for e in ex] == ["town/twin", None, "7"]
