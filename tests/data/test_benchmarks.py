"""The paper's benchmarks by name (arpo/data/benchmarks.py): the registry, the dev slices shipped in
arpo, local copies in the on-disk formats `datasets` reads (made here, with the Hub's column names)
loaded through the same field mapping as the Hub, and the message when the Hub is unreachable."""

import json
import socket

import pytest

from arpo.data.benchmarks import ALIASES, BENCHMARKS, map_row, subset_ids, xor_decrypt, xor_encrypt
from arpo.data.datasets import load_examples
from arpo.errors import ArpoError

PAPER = {"aime24", "aime25", "math500", "math", "gsm8k", "webwalkerqa", "hotpotqa", "2wiki", "musique", "bamboogle",
         "gaia", "hle", "xbench-deepsearch"}


def test_the_thirteen_benchmarks_with_their_metrics():
    assert set(BENCHMARKS) == PAPER and len(BENCHMARKS) == 13
    assert {n for n, b in BENCHMARKS.items() if b.metric == "f1"} == {"hotpotqa", "2wiki", "musique", "bamboogle"}
    assert all(b.metric in ("f1", "llm-judge") for b in BENCHMARKS.values())
    assert ALIASES["webwalker"] == "webwalkerqa"  # Table 1's WebWalker is Table 2's WebWalkerQA
    for b in BENCHMARKS.values():
        assert b.hf_id.count("/") == 1 and b.split and b.license and "question" in b.fields
        assert ("answer" in b.fields) != ("answers" in b.fields)


def test_arpo_data_list_shows_them(capsys):
    from arpo.cli import main

    assert main(["data", "list", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    bench = {r["name"]: r for r in rows if r["kind"] == "benchmark"}
    assert set(bench) == {f"bench:{n}" for n in PAPER}
    g = bench["bench:gaia"]
    assert (g["hf_id"], g["config"], g["split"], g["metric"], g["gated"]) == (
        "gaia-benchmark/GAIA", "2023_all", "validation", "llm-judge", True)
    assert g["fields"] == {"question": "Question", "answer": "Final answer", "id": "task_id"} and g["dev"] is None
    assert bench["bench:bamboogle"]["dev_rows"] == 20 and bench["bench:bamboogle"]["metric"] == "f1"
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "bench:gaia" in out and "llm-judge" in out and "paper metric: f1" in out


@pytest.mark.parametrize("name", [n for n, b in BENCHMARKS.items() if b.dev])
def test_the_dev_slices_load_as_examples(name):
    exs = load_examples(f"bench:{name}:dev")
    assert len(exs) == 20 and all(e["answers"] and e["question"] for e in exs)
    assert {e["task"] for e in exs} == {BENCHMARKS[name].task}
    assert len({e["id"] for e in exs}) == 20
    assert load_examples(f"bench:{name}:dev[5:7]")[0]["id"] == exs[5]["id"]


def test_no_dev_slice_where_the_license_does_not_allow_one():
    with pytest.raises(ArpoError, match="no dev slice"):
        load_examples("bench:gaia:dev")
    with pytest.raises(ArpoError, match="unknown benchmark 'nope'"):
        load_examples("bench:nope")


# ---- local copies, the Hub's column names, the same mapping --------------------------------------------
def _parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# two of the 103 GAIA task ids the paper evaluated (RUC-NLPIR/ARPO evaluation/data/gaia/test.jsonl, rows 1-2)
T1, T3 = "17b5a6a3-bc87-42e8-b0fb-6ab0781ef2cc", "04a04a9b-226c-43fd-b319-d5e89743676f"


def test_gaia_local_parquet_keeps_the_papers_text_only_questions(tmp_path):
    assert len(subset_ids("gaia.paper_ids.txt")) == 103 and {T1, T3} <= subset_ids("gaia.paper_ids.txt")
    rows = [{"task_id": T1, "Question": "Q one?", "Level": "1", "Final answer": "34689", "file_name": ""},
            {"task_id": "t2", "Question": "Q with a file?", "Level": "2", "Final answer": "7", "file_name": "a.xlsx"},
            {"task_id": T3, "Question": "Q three?", "Level": "3", "Final answer": "Paris", "file_name": ""},
            {"task_id": "t4", "Question": "Not evaluated by the paper?", "Level": "1", "Final answer": "x",
             "file_name": ""}]
    p = _parquet(tmp_path / "gaia.parquet", rows)
    exs = load_examples(f"bench:gaia@{p}")
    assert [(e["id"], e["question"], e["answers"], e["task"]) for e in exs] == [
        (T1, "Q one?", ["34689"], "qa"), (T3, "Q three?", ["Paris"], "qa")]


def test_a_copy_without_any_of_the_papers_questions_is_a_clear_error(tmp_path):
    p = _parquet(tmp_path / "gaia.parquet", [{"task_id": "t1", "Question": "Q?", "Final answer": "a", "file_name": ""}])
    with pytest.raises(ArpoError, match=r"none of its 1 rows is among the 103 questions the paper evaluated"):
        load_examples(f"bench:gaia@{p}")


def test_flashrag_jsonl_math_boxed_and_int_answers(tmp_path):
    p = _jsonl(tmp_path / "bamboogle.jsonl", [{"id": "test_0", "question": "Who?", "golden_answers": ["a", "b"]}])
    assert load_examples(f"bench:bamboogle@{p}")[0]["answers"] == ["a", "b"]
    p = _jsonl(tmp_path / "math.jsonl", [{"problem": "1+1?", "solution": "so $\\boxed{\\frac{1}{2}}$.", "level": "1"}])
    assert load_examples(f"bench:math@{p}")[0]["answers"] == ["\\frac{1}{2}"]
    p = _parquet(tmp_path / "aime25.parquet", [{"problem": "Find b.", "answer": 70, "id": "0"}])
    ex = load_examples(f"bench:aime25@{p}")[0]
    assert (ex["answers"], ex["task"], ex["id"]) == (["70"], "math", "0")


def test_hle_and_xbench_local_copies(tmp_path):
    h1 = "668825f80a642802bdfeadfa"  # the first of the paper's 500 (RUC-NLPIR/ARPO evaluation/data/hle/top.json)
    assert len(subset_ids("hle.paper_ids.txt")) == 500 and h1 in subset_ids("hle.paper_ids.txt")
    p = _parquet(tmp_path / "hle.parquet", [{"id": h1, "question": "q1", "answer": "a1", "image": ""},
                                            {"id": "h2", "question": "q2", "answer": "a2", "image": ""},
                                            {"id": "h3", "question": "q3", "answer": "a3", "image": "data:image/png"}])
    assert [e["id"] for e in load_examples(f"bench:hle@{p}")] == [h1]
    canary = "BENCHMARK DATA SHOULD NEVER APPEAR AS PLAIN TEXT ONLINE. canary GUID xbench-test"
    enc = {"id": 1, "prompt": xor_encrypt("截至2024年，问题？", canary),
           "answer": xor_encrypt("161.27元", canary), "canary": canary}
    assert xor_decrypt(enc["answer"], canary) == "161.27元"
    p = _jsonl(tmp_path / "xbench.jsonl", [enc])
    ex = load_examples(f"bench:xbench@{p}")[0]
    assert (ex["question"], ex["answers"], ex["id"]) == ("截至2024年，问题？", ["161.27元"], "1")


def test_a_save_to_disk_folder_with_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    # the Hub's columns (callanwu/WebWalkerQA's card: Question, Answer, Root_Url, Info), its splits main / silver
    row = {"Question": "哪一年?", "Answer": "2024", "Root_Url": "https://example.org/",
           "Info": {"Hop": "single_source", "Language": "Chinese"}}
    d = datasets.DatasetDict({"main": datasets.Dataset.from_list([row]),
                              "silver": datasets.Dataset.from_list([dict(row, Question="x", Answer="y")])})
    d.save_to_disk(str(tmp_path / "ww"))
    assert load_examples(f"bench:webwalker@{tmp_path / 'ww'}")[0]["answers"] == ["2024"]  # the benchmark's split


def test_a_local_copy_with_other_column_names_is_a_clear_error(tmp_path):
    p = _jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "a", "file_name": ""}])
    with pytest.raises(ArpoError, match=r"no column 'Question' for question .*Hub's column names"):
        load_examples(f"bench:gaia@{p}")
    with pytest.raises(ArpoError, match="does not exist"):
        load_examples(f"bench:gaia@{tmp_path / 'missing.parquet'}")


def test_map_row_is_the_one_mapping():
    b = BENCHMARKS["gsm8k"]
    assert map_row(b, {"question": "q", "answer": "x\n#### 1,234"}, "w") == {"task": "math", "question": "q",
                                                                              "answer": "x\n#### 1,234"}
    assert map_row(BENCHMARKS["hle"], {"id": "h", "question": "q", "answer": "a", "image": "x.png"}, "w") is None
    assert map_row(BENCHMARKS["webwalkerqa"], {"Question": "q", "Answer": "a", "Root_Url": "u"}, "w") == {
        "task": "qa", "question": "q", "answer": "a"}


# ---- no network: a clear message, fast --------------------------------------------------------------
def test_without_network_the_message_says_what_to_do(monkeypatch, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here: the Hub is unreachable
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    with pytest.raises(ArpoError) as e:
        load_examples("bench:gaia")
    msg = str(e.value)
    assert msg.startswith("bench:gaia: no network") and "gaia-benchmark/GAIA:2023_all split 'validation'" in msg
    assert "gated" in msg and "bench:gaia@PATH" in msg and "HF_HUB_OFFLINE=1" in msg
    from arpo.cli import main

    assert main(["data", "show", "bench:bamboogle", "--limit", "1"]) != 0
    err = capsys.readouterr().err
    assert "no network" in err and "bench:bamboogle:dev ships inside arpo" in err


def test_eval_reports_the_papers_metric(tmp_path):
    from arpo.cli import main
    from arpo.testing import save_tiny_model

    model = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "ev.json"
    assert main(["eval", "--model", model, "--data", "bench:bamboogle:dev", "--limit", "2", "--tools", "python",
                 "--max-response-tokens", "8", "--device", "cpu", "--out", str(out), "--quiet"]) == 0
    r = json.loads(out.read_text())["results"]["bench:bamboogle:dev"]
    assert r["paper_metric"] == "f1" and r["paper_score"] == r["score"] and r["questions"] == 2
