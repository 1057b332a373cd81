"""The browse tool against real HTTP servers on localhost: the local web (`arpo web serve`'s app) for
extraction, windows and query excerpts; scripted servers for the caps (redirects, size, time), the
address checks, content types, retries, and the summarizer behind an OpenAI-compatible endpoint."""

import json
import time

import pytest

pytest.importorskip("httpx")
pytest.importorskip("trafilatura")

from web_servers import scripted_server, uvicorn_app

from arpo.ports import free_port
from arpo.settings.web import web_config
from arpo.tools import build_tools
from arpo.tools.base import ToolCall
from arpo.tools.web.browse import BrowseTool, excerpt, parse_input, windows

LONG = "\n\n".join(f"Paragraph {i}. " + " ".join(f"word{i}x{j}" for j in range(30)) for i in range(12)) + \
    "\n\nThe lighthouse of Alexandria was built in the 3rd century BC by Sostratus of Cnidus."
CORPUS = [{"title": "Lighthouse", "text": LONG, "url": "https://example.org/pages/lighthouse"},
          {"title": "Ed Wood (film)", "text": "Ed Wood is a 1994 American film directed by Tim Burton."},
          {"title": "Tim Burton", "text": "Tim Burton is an American filmmaker born in 1958 in Burbank."}]


@pytest.fixture(scope="module")
def local_web(tmp_path_factory):
    from arpo.web.server import create_app
    from arpo.web.site import Site

    d = tmp_path_factory.mktemp("web")
    (d / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    site = Site.from_corpus([str(d / "c.jsonl")], d / "index")
    with uvicorn_app(create_app(site)) as url:
        yield url


def local(url, **kw):
    return BrowseTool(web_config({"provider": "local", "url": url, **kw}))


def test_parse_input_and_windows():
    assert parse_input(" https://a.org/x ") == ("https://a.org/x", 1, None)
    assert parse_input("https://a.org/x page=3") == ("https://a.org/x", 3, None)
    assert parse_input("<https://a.org/x> | who built it ") == ("https://a.org/x", 1, "who built it")
    with pytest.raises(ValueError):
        parse_input("   ")
    text = "one two three. four five six.\n\nseven eight nine ten"
    ws = windows(text, 16)
    assert "".join(ws) == text and all(len(w) <= 16 for w in ws) and ws[0] == "one two three. "
    assert windows("", 10) == [""]


def test_excerpt_picks_the_passages_about_the_query():
    out = excerpt(LONG, "who built the lighthouse of Alexandria", 300)
    assert out.startswith("The lighthouse of Alexandria was built") and len(out) <= 300
    assert excerpt("alpha beta", "zzz", 5) == "alpha"  # nothing matches: the beginning


def test_browse_local_page_windows_and_excerpt(local_web):
    tool = local(local_web, window_chars=1000)
    p1 = tool(f"{local_web}/pages/lighthouse")
    assert p1.ok and p1.output.startswith(f"URL: {local_web}/pages/lighthouse\nTitle: Lighthouse\n[page 1 of ")
    n = p1.meta["pages"]
    assert n >= 3 and "page=2 for more" in p1.output and "Paragraph 0." in p1.output
    assert "arpo web serve" not in p1.output and "Related pages" not in p1.output  # boilerplate removed
    last = tool(f"{local_web}/pages/lighthouse page={n}")
    assert last.ok and f"[page {n} of {n}]" in last.output and "Sostratus of Cnidus" in last.output
    beyond = tool(f"{local_web}/pages/lighthouse page={n + 1}")
    assert not beyond.ok and f"has {n} page(s)" in beyond.output
    q = tool(f"{local_web}/pages/lighthouse | who built the lighthouse")
    assert q.ok and "Passages about 'who built the lighthouse'" in q.output and "Sostratus" in q.output
    assert len(q.output) < 1300
    missing = tool(f"{local_web}/pages/nope")
    assert not missing.ok and missing.output.startswith("Error: browse failed: HTTP 404")
    j = tool.call({"url": f"{local_web}/wiki/Tim_Burton", "query": "born"})
    assert j.ok and "Burbank" in j.output
    assert tool.calls == 6 and tool.failures == 2
    tool.close()


def test_loopback_refused_unless_configured(local_web):
    page = f"{local_web}/wiki/Tim_Burton"
    plain = BrowseTool(web_config({"provider": "ddgs"}))  # the internet setting: no private addresses
    r = plain(page)
    assert not r.ok and "refused to fetch 127.0.0.1: it resolves to the loopback address" in r.output
    assert not plain("http://localhost:1/").ok and "loopback" in plain("http://localhost:1/").output
    assert "only http:// and https://" in plain("file:///etc/passwd").output
    assert "only http:// and https://" in plain("ftp://example.org/x").output
    port = local_web.rsplit(":", 1)[1]
    assert BrowseTool(web_config({"provider": "ddgs", "allow_hosts": [f"127.0.0.1:{port}"]}))(page).ok
    assert not BrowseTool(web_config({"provider": "ddgs", "allow_hosts": ["127.0.0.1:1"]}))(page).ok  # another port
    assert BrowseTool(web_config({"provider": "ddgs", "allow_private": True}))(page).ok
    assert local(local_web)(page).ok  # the local web as the search provider: allowed


def test_redirects_are_followed_checked_and_capped():
    def handle(req):
        if req.path == "/to-localhost":
            return 302, {"location": "http://" + req.headers["host"].replace("127.0.0.1", "localhost") + "/0"}, ""
        n = int(req.path.strip("/") or 0)
        if n < 3:
            return 301, {"location": f"/{n + 1}"}, ""
        return 200, {"content-type": "text/plain"}, f"arrived at {n}"

    with scripted_server(handle) as srv:
        host = srv.url.split("//")[1]
        ok = BrowseTool(web_config({"allow_hosts": [host], "max_redirects": 3}))(f"{srv.url}/0")
        assert ok.ok and ok.output == f"URL: {srv.url}/3\n[page 1 of 1]\narrived at 3"
        capped = BrowseTool(web_config({"allow_hosts": [host], "max_redirects": 2}))(f"{srv.url}/0")
        assert not capped.ok and "more than 2 redirects" in capped.output
        srv.requests.clear()
        # a redirect into a refused host
        hop = BrowseTool(web_config({"allow_hosts": [host]}))(f"{srv.url}/to-localhost")
        assert not hop.ok and "refused to fetch localhost" in hop.output and len(srv.requests) == 1


def test_size_time_and_type_caps():
    def handle(req):
        if req.path == "/big":
            return 200, {"content-type": "text/plain"}, "x" * 50_000
        if req.path == "/slow":
            def drip():
                for _ in range(40):
                    yield b"<p>slow</p>"
                    time.sleep(0.1)
            return 200, {"content-type": "text/html"}, drip()
        if req.path == "/pdf":
            return 200, {"content-type": "application/pdf"}, b"%PDF-1.4"
        if req.path == "/json":
            return 200, {}, {"answer": 42}
        return 404, {}, ""

    with scripted_server(handle) as srv:
        cfg = {"allow_hosts": [srv.url.split("//")[1]], "max_bytes": 1000, "window_chars": 5000}
        big = BrowseTool(web_config(cfg))(f"{srv.url}/big")
        assert big.ok and "cut at its size limit" in big.output
        assert big.output.count("x") == 1000 + big.output[:80].count("x")
        t0 = time.monotonic()
        slow = BrowseTool(web_config(cfg | {"browse_timeout_s": 0.5}))(f"{srv.url}/slow")
        assert not slow.ok and "0.5s" in slow.output and time.monotonic() - t0 < 3
        pdf = BrowseTool(web_config(cfg))(f"{srv.url}/pdf")
        assert not pdf.ok and "cannot read content type application/pdf" in pdf.output
        js = BrowseTool(web_config(cfg))(f"{srv.url}/json")
        assert js.ok and js.output.endswith('{"answer": 42}')


def test_429_then_200_is_retried():
    answers = iter([(429, {"retry-after": "0.3"}, "slow down"),
                    (200, {"content-type": "text/html"}, "<html><body><p>Finally here.</p></body></html>")])
    with scripted_server(lambda req: next(answers)) as srv:
        r = BrowseTool(web_config({"allow_hosts": [srv.url.split("//")[1]], "retries": 1}))(f"{srv.url}/p")
        assert r.ok and "Finally here." in r.output
        assert len(srv.requests) == 2 and srv.requests[1].t - srv.requests[0].t >= 0.25


def test_summarizer_over_an_openai_compatible_endpoint(local_web, monkeypatch):
    seen = []

    def chat(req):
        assert req.method == "POST" and req.path == "/v1/chat/completions"
        seen.append(req)
        body = req.json()
        return 200, {}, {"id": "c1", "object": "chat.completion", "model": body["model"],
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": " Sostratus of Cnidus built it. "}}]}

    monkeypatch.setenv("MY_KEY", "sk-local")
    with scripted_server(chat) as llm:
        tool = local(local_web, summarizer_url=llm.url + "/v1", summarizer_model="reader-1",
                     summarizer_key_env="MY_KEY", summarize_min_chars=500)
        r = tool(f"{local_web}/pages/lighthouse | who built it")
        assert r.ok and r.meta["summarized"] and tool.summarized == 1
        assert r.output.endswith("Summary by reader-1 for who built it:\nSostratus of Cnidus built it.")
        body = seen[0].json()
        assert body["model"] == "reader-1" and "Goal: who built it" in body["messages"][1]["content"]
        assert "Sostratus" in body["messages"][1]["content"] and seen[0].headers["authorization"] == "Bearer sk-local"
        short = tool(f"{local_web}/wiki/Tim_Burton")  # shorter than summarize_min_chars: shown as is
        assert short.ok and "Burbank" in short.output and len(seen) == 1
    down = local(local_web, summarizer_url=f"http://127.0.0.1:{free_port()}/v1", summarizer_model="m",
                 summarize_min_chars=500)(f"{local_web}/pages/lighthouse | who built it")
    assert down.ok and "summarizer unavailable" in down.output and "Sostratus" in down.output


def test_registry_tag_and_json_calls(local_web):
    reg = build_tools(["web_search", "browse"], web={"provider": "local", "url": local_web, "top_k": 2})
    s = reg.run(reg.parse_last_call("<web_search> Tim Burton filmmaker </web_search>"))
    assert s.ok and s.output.startswith(f"1. Tim Burton\nURL: {local_web}/wiki/Tim_Burton\n")
    b = reg.run(reg.parse_last_call(f"<browse> {local_web}/wiki/Tim_Burton | born </browse>"))
    assert b.ok and "1958" in b.output
    j = reg.run(ToolCall("browse", "{}", arguments={"url": f"{local_web}/pages/lighthouse", "page": 2}))
    assert j.ok and "[page 2 of" in j.output
    bad = reg.run(ToolCall("browse", "{}", arguments={"page": 2}))
    assert not bad.ok and "url" in bad.output
    reg.close()


def test_summarizer_through_a_real_arpo_serve_agent(local_web, tmp_path):
    """The browser model behind `arpo serve agent` (tiny random model, greedy): the page goes through
    its OpenAI-compatible endpoint; its answer is the summary, or, when the random model's final turn
    is empty, the excerpt with the reason."""
    import os
    import subprocess
    import sys

    import httpx

    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path),
               ARPO_CACHE_DIR=os.environ.get("ARPO_CACHE_DIR", str(tmp_path / "cache")))
    proc = subprocess.Popen([sys.executable, "-m", "arpo", "serve", "agent", "--model", "tiny-random", "--port",
                             str(port), "--max-response-tokens", "24", "--log-level", "warning"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.3)
        tool = local(local_web, summarizer_url=f"http://127.0.0.1:{port}/v1", summarizer_model="tiny-random",
                     summarize_min_chars=500, summarizer_max_tokens=16,
                     summarizer_input_chars=600)  # the tiny model's context: 2048 tokens of ~1 character
        r = tool(f"{local_web}/pages/lighthouse | who built it")
        assert r.ok
        if r.meta.get("summarized"):
            summary = r.output.split("Summary by tiny-random for who built it:\n", 1)[1]
            assert summary.strip() and tool.summarized == 1
        else:
            assert "summarizer unavailable" in r.output and "an empty answer" in r.output and "Sostratus" in r.output
    finally:
        proc.terminate()
        proc.wait(20)
