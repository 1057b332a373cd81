"""arpo's local HTTP servers against hostile clients (issue 37), each a real uvicorn server on 127.0.0.1:
`arpo serve agent` (serve/app.py), `arpo serve retriever` (retrieval/server.py) and `arpo web serve`
(web/server.py) refuse oversized bodies (HTTP 413) and Host names other than loopback ones (DNS
rebinding), the agent server stays responsive while a large request is read, the retriever takes an
optional key, and a server bound beyond loopback without a key says so loudly."""

import json
import socket
import threading
import time
from contextlib import contextmanager

import pytest

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")
pytest.importorskip("bm25s")

from arpo.http_guard import allowed_hosts, bind_warning, host_ok  # noqa: E402


@contextmanager
def served(app):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.time() + 30
    while not server.started:
        assert time.time() < deadline and th.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        th.join(10)
        sock.close()


DOCS = [{"title": "Ed Wood", "text": "Ed Wood is a 1994 American film directed by Tim Burton."},
        {"title": "Tim Burton", "text": "Tim Burton is an American filmmaker born in 1958 in Burbank."}]


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    from arpo.retrieval.index import Doc, Index

    docs = [Doc(id=str(i), title=d["title"], text=d["text"]) for i, d in enumerate(DOCS)]
    return Index.build(docs, tmp_path_factory.mktemp("idx") / "small", progress=False, sources=["in-code"])


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from arpo.web.site import Site

    d = tmp_path_factory.mktemp("web")
    (d / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in DOCS))
    return Site.from_corpus([str(d / "c.jsonl")], d / "index")


@pytest.fixture(scope="module")
def agent_app(tiny_lm, tiny_tok):
    from arpo.engine.hf import HFEngine
    from arpo.serve.app import create_app
    from arpo.serve.scheduler import AgentScheduler
    from arpo.settings import AgentConfig
    from arpo.tools.registry import ToolRegistry

    sched = AgentScheduler(HFEngine(tiny_lm, tiny_tok), ToolRegistry([]), AgentConfig(max_response_tokens=8))
    yield create_app(sched, tiny_tok, model_name="m", system="", context_len=2048, max_response_tokens=8)
    sched.close()


# ---- the Host header ----------------------------------------------------------------------------------
def test_host_names_of_a_loopback_server():
    allowed = allowed_hosts("127.0.0.1")
    assert all(host_ok(h, allowed) for h in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "localhost",
                                              "LOCALHOST"))
    assert not any(host_ok(h, allowed) for h in ("evil.example:8000", "evil.example", "127.0.0.1.evil.example", ""))
    assert allowed_hosts("0.0.0.0") is None and host_ok("anything:1", None)  # cannot know its names


def test_wrong_host_refused_by_every_server(index, site, agent_app):
    from arpo.retrieval.server import create_app as retriever_app
    from arpo.web.server import create_app as web_app

    for app, path in ((retriever_app(index), "/health"), (web_app(site), "/health"), (agent_app, "/health")):
        with served(app) as url:
            assert httpx.get(url + path).status_code == 200
            assert httpx.get(url + path, headers={"host": f"localhost:{url.rsplit(':', 1)[1]}"}).status_code == 200
            bad = httpx.get(url + path, headers={"host": "rebound.evil.example"})
            assert bad.status_code == 400 and "invalid Host header" in bad.text, (path, bad.text)


def test_allowed_hosts_from_the_environment(monkeypatch):
    monkeypatch.setenv("ARPO_ALLOWED_HOSTS", "arpo.internal, 10.0.0.5")
    assert allowed_hosts("127.0.0.1") == ["arpo.internal", "10.0.0.5"]
    monkeypatch.setenv("ARPO_ALLOWED_HOSTS", "*")
    assert allowed_hosts("127.0.0.1") is None


# ---- body sizes ---------------------------------------------------------------------------------------
def _chunks(total: int, size: int = 256 * 1024):
    for _ in range(total // size):
        yield b" " * size


def test_retriever_refuses_oversized_bodies(index):
    """Before: no limit (a 16 MB body took 38 s); now HTTP 413 before any search."""
    from arpo.retrieval.server import MAX_BODY_BYTES, create_app

    with served(create_app(index)) as url:
        big = json.dumps({"queries": ["Tim Burton " * (MAX_BODY_BYTES // 10)], "top_k": 1})
        t0 = time.monotonic()
        r = httpx.post(url + "/search", content=big, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 413 and "limit" in r.json()["message"] and time.monotonic() - t0 < 5
        r = httpx.post(url + "/search", content=_chunks(MAX_BODY_BYTES + 512 * 1024),
                       headers={"content-type": "application/json"}, timeout=60)  # chunked: no Content-Length
        assert r.status_code == 413, r.text
        ok = httpx.post(url + "/search", json={"queries": ["Tim Burton"], "top_k": 1})
        assert ok.status_code == 200 and ok.json()["results"][0][0]["title"] == "Tim Burton"


def test_retriever_key(index, monkeypatch):
    from arpo.retrieval.server import create_app
    from arpo.tools.search import SearchTool

    with served(create_app(index, api_key="k-123")) as url:
        assert httpx.get(url + "/health").status_code == 200  # liveness stays open
        assert httpx.post(url + "/search", json={"queries": ["x"]}).status_code == 401
        bad = httpx.post(url + "/search", json={"queries": ["x"]}, headers={"authorization": "Bearer nope"})
        assert bad.status_code == 401 and "ARPO_RETRIEVER_KEY" in bad.json()["message"]
        monkeypatch.setenv("ARPO_RETRIEVER_KEY", "k-123")
        r = SearchTool(url=url, top_k=1)("Tim Burton")
        assert r.ok and "Tim Burton" in r.output
        monkeypatch.delenv("ARPO_RETRIEVER_KEY")
        r = SearchTool(url=url, top_k=1)("Tim Burton")
        assert not r.ok and "401" in r.output


def test_agent_refuses_oversized_bodies(agent_app):
    from arpo.settings import MAX_REQUEST_BYTES

    with served(agent_app) as url:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (MAX_REQUEST_BYTES + 10)}]})
        r = httpx.post(url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"},
                       timeout=60)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
        r = httpx.post(url + "/v1/chat/completions", content=_chunks(MAX_REQUEST_BYTES + 512 * 1024),
                       headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 413, r.text


def test_agent_health_stays_responsive_during_a_large_request(agent_app):
    """A 3.9 MB request (within the 4 MiB limit): before, its prompt was tokenized on the event loop
    (~45 s here for 3 MB with the tiny tokenizer, /health frozen); now messages that cannot fit the
    context are refused before tokenizing, and tokenizing runs off the loop."""
    with served(agent_app) as url:
        content = "hello world " * 320_000
        result: dict = {}

        def post():
            result["r"] = httpx.post(url + "/v1/chat/completions", timeout=120,
                                     json={"model": "m", "messages": [{"role": "user", "content": content}]})

        th = threading.Thread(target=post, daemon=True)
        waits = []
        with httpx.Client(timeout=5) as http:
            http.get(url + "/health")
            th.start()
            t_end = time.monotonic() + 3
            while time.monotonic() < t_end:
                t0 = time.monotonic()
                assert http.get(url + "/health").status_code == 200
                waits.append(time.monotonic() - t0)
                time.sleep(0.05)
        th.join(60)
        r = result["r"]
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert max(waits) < 2.0, f"/health took {max(waits):.2f}s ({len(waits)} calls)"  # before: > 5 s
        small = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert small.status_code == 200, small.text


def test_a_cross_site_form_cannot_drive_the_json_apis(index, agent_app):
    """What a web page can send to a loopback server without CORS: a "simple" POST (text/plain, form
    encodings). The JSON APIs refuse it before any work (FastAPI parses only JSON content types)."""
    from arpo.retrieval.server import create_app as retriever_app

    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    search = json.dumps({"queries": ["Tim Burton"], "top_k": 1})
    for app, path, body in ((agent_app, "/v1/chat/completions", chat), (retriever_app(index), "/search", search)):
        with served(app) as url:
            for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
                r = httpx.post(url + path, content=body, headers={"content-type": ctype})
                assert r.status_code in (400, 422) and "access-control-allow-origin" not in r.headers, (path, ctype)
            assert httpx.post(url + path, content=body, headers={"content-type": "application/json"}).status_code == 200


# ---- the bind warning ---------------------------------------------------------------------------------
def test_bind_warning_text():
    msg = bind_warning("arpo serve agent", "0.0.0.0", 8000, has_key=False)
    assert msg.startswith("WARNING: arpo serve agent listens on every network interface (port 8000) without an "
                          "API key")
    assert bind_warning("arpo serve agent", "0.0.0.0", 8000, has_key=True) is None
    assert bind_warning("arpo serve agent", "127.0.0.1", 8000, has_key=False) is None
    assert bind_warning("arpo web serve", "192.168.1.7", 8090, has_key=False).startswith(
        "WARNING: arpo web serve listens on 192.168.1.7 (port 8090)")


def test_servers_print_the_warning_on_all_interfaces(index, site, monkeypatch, capsys):
    """The serve() functions up to uvicorn.run (not started: the tests listen on 127.0.0.1 only)."""
    import arpo.ports
    from arpo.retrieval import server as retriever
    from arpo.web import server as web

    runs = []

    class Listening:  # what arpo.ports.listen returns, without listening anywhere
        def __init__(self, port):
            self.port = port

        def getsockname(self):
            return ("0.0.0.0", self.port)

        def close(self):
            pass

    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: runs.append(kw))
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: runs.append({"sockets": sockets}))
    monkeypatch.setattr(arpo.ports, "require_port_free", lambda host, port: None)
    monkeypatch.setattr(arpo.ports, "listen", lambda host, port: Listening(port))
    monkeypatch.delenv("ARPO_RETRIEVER_KEY", raising=False)
    web.serve(site, host="0.0.0.0", port=18090)
    assert "WARNING: arpo web serve listens on every network interface (port 18090)" in capsys.readouterr().err
    retriever.serve(str(index.path), host="0.0.0.0", port=18001)
    assert "WARNING: arpo serve retriever listens on every network interface" in capsys.readouterr().err
    retriever.serve(str(index.path), host="0.0.0.0", port=18001, api_key="k")
    retriever.serve(str(index.path), host="127.0.0.1", port=18001)
    assert "WARNING" not in capsys.readouterr().err and len(runs) == 4
