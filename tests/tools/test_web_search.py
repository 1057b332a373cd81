"""The web_search tool against real HTTP servers on localhost that speak each provider's API (the
tool's base URL points at them): request shapes, keys from the environment, parsing, the numbered
output, retries on 429/5xx with backoff, the per-provider rate limit, the cache, and errors that
never stop the rollout."""

import time

import pytest

pytest.importorskip("httpx")

from web_servers import scripted_server

from arpo.errors import ArpoError
from arpo.settings.web import web_config
from arpo.tools import build_tools
from arpo.tools.base import ToolCall
from arpo.tools.cache import ToolCache
from arpo.tools.web.web_search import WebSearchTool, format_results
from arpo.tools.web.webhttp import RateLimiter, retry_delay

HITS = [("Ed Wood (film)", "https://example.org/wiki/Ed_Wood_(film)", "A 1994 film directed by Tim Burton."),
        ("Tim Burton", "https://example.org/wiki/Tim_Burton", "An American filmmaker.  Born 1958.")]
KEYS = {"serper": "SERPER_API_KEY", "tavily": "TAVILY_API_KEY", "brave": "BRAVE_API_KEY", "exa": "EXA_API_KEY"}


def provider_api(provider):  # noqa: C901 - one fake per provider API, a branch each
    """A handler speaking `provider`'s API: checks method, path, key header and query fields as the
    real API wants them; answers in its response layout (HTTP 401 on a wrong key, 400 on a bad request)."""

    def handle(req):  # noqa: C901 - one fake per provider API, a branch each
        if provider == "serper":
            if req.method != "POST" or req.path != "/search":
                return 404, {}, {"message": "not found"}
            if req.headers.get("x-api-key") != "k-serper":
                return 401, {}, {"message": "Unauthorized."}
            body = req.json()
            return 200, {}, {"searchParameters": {"q": body["q"], "num": body["num"]},
                             "organic": [{"title": t, "link": u, "snippet": s, "position": i}
                                         for i, (t, u, s) in enumerate(HITS[: body["num"]], 1)]}
        if provider == "tavily":
            if req.method != "POST" or req.path != "/search":
                return 404, {}, {"detail": "not found"}
            if req.headers.get("authorization") != "Bearer k-tavily":
                return 401, {}, {"detail": {"error": "Unauthorized: missing or invalid API key."}}
            body = req.json()
            return 200, {}, {"query": body["query"], "answer": None, "response_time": 0.5,
                             "results": [{"title": t, "url": u, "content": s, "score": 0.9}
                                         for t, u, s in HITS[: body["max_results"]]]}
        if provider == "brave":
            if req.method != "GET" or req.path != "/res/v1/web/search":
                return 404, {}, "not found"
            if req.headers.get("x-subscription-token") != "k-brave":
                return 401, {}, {"type": "ErrorResponse", "error": {"code": "SUBSCRIPTION_TOKEN_INVALID"}}
            n = int(req.query["count"])
            return 200, {}, {"type": "search", "query": {"original": req.query["q"]},
                             "web": {"type": "search", "results": [{"title": t, "url": u, "description": s}
                                                                   for t, u, s in HITS[:n]]}}
        if provider == "exa":
            if req.method != "POST" or req.path != "/search":
                return 404, {}, {"error": "not found"}
            if req.headers.get("x-api-key") != "k-exa":
                return 401, {}, {"error": "Invalid API key"}
            body = req.json()
            assert body["contents"]["text"]["maxCharacters"] >= 1
            return 200, {}, {"requestId": "r1", "results": [{"id": u, "title": t, "url": u, "text": s}
                                                           for t, u, s in HITS[: body["numResults"]]]}
        if provider in ("searxng", "local"):
            if req.method != "GET" or req.path != "/search":
                return 404, {}, "not found"
            if req.query.get("format") != "json":
                return 403, {}, "Forbidden"  # SearXNG without the json format enabled
            return 200, {}, {"query": req.query["q"], "number_of_results": 2,
                             "results": [{"title": t, "url": u, "content": s, "engine": "x"} for t, u, s in HITS]}
        raise AssertionError(provider)

    return handle


@pytest.mark.parametrize("provider", ["serper", "tavily", "brave", "exa", "searxng"])
def test_each_provider_request_and_response(provider, monkeypatch):
    for env in KEYS.values():
        monkeypatch.delenv(env, raising=False)
    if provider in KEYS:
        monkeypatch.setenv(KEYS[provider], f"k-{provider}")
    with scripted_server(provider_api(provider)) as srv:
        tool = WebSearchTool(web_config({"provider": provider, "url": srv.url, "top_k": 2, "snippet_chars": 20}))
        r = tool("  who directed   Ed Wood ")
        assert r.ok, r.output
        assert r.output == ("1. Ed Wood (film)\nURL: https://example.org/wiki/Ed_Wood_(film)\nA 1994 film directed…\n\n"
                            "2. Tim Burton\nURL: https://example.org/wiki/Tim_Burton\nAn American filmmake…")
        assert r.meta["urls"] == [u for _, u, _ in HITS] and r.meta["titles"] == [t for t, _, _ in HITS]
        req = srv.requests[0]
        sent = req.query.get("q") if req.method == "GET" else (req.json().get("q") or req.json().get("query"))
        assert sent == "who directed Ed Wood" and req.headers["user-agent"].startswith("arpo-web-search")
        tool.close()


@pytest.mark.parametrize("provider", ["serper", "tavily", "brave", "exa"])
def test_missing_or_refused_key_is_an_error_result(provider, monkeypatch):
    monkeypatch.delenv(KEYS[provider], raising=False)
    with scripted_server(provider_api(provider)) as srv:
        tool = WebSearchTool(web_config({"provider": provider, "url": srv.url}))
        r = tool("x")
        assert not r.ok and r.output == f"Error: web search failed: no API key for {provider}: set the environment " \
                                        f"variable {KEYS[provider]}"
        assert srv.requests == []  # nothing sent without a key
        monkeypatch.setenv(KEYS[provider], "wrong")
        r = tool("x")
        assert not r.ok and "HTTP 401" in r.output and KEYS[provider] in r.output
        assert tool.calls == 2 and tool.failures == 2
        tool.close()


def test_api_key_env_names_another_variable(monkeypatch):
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    monkeypatch.setenv("MY_SERPER", "k-serper")
    with scripted_server(provider_api("serper")) as srv:
        r = WebSearchTool(web_config({"provider": "serper", "url": srv.url, "api_key_env": "MY_SERPER"}))("q")
        assert r.ok and r.output.startswith("1. Ed Wood (film)")


def test_429_then_200_is_retried_after_retry_after():
    answers = iter([(429, {"retry-after": "0.4"}, {"message": "Too many requests"}),
                    (200, {}, {"results": [{"title": "T", "url": "https://e.org/t", "content": "c"}]})])
    with scripted_server(lambda req: next(answers)) as srv:
        tool = WebSearchTool(web_config({"provider": "searxng", "url": srv.url, "retries": 2, "backoff_s": 0.01,
                                         "rate_limit": 0}))
        r = tool("q")
        assert r.ok and r.output == "1. T\nURL: https://e.org/t\nc"
        assert len(srv.requests) == 2
        assert srv.requests[1].t - srv.requests[0].t >= 0.35  # the server's Retry-After, not our 0.01 s


def test_5xx_retried_with_exponential_backoff_then_an_error_result():
    with scripted_server(lambda req: (503, {}, {"error": "upstream down"})) as srv:
        tool = WebSearchTool(web_config({"provider": "searxng", "url": srv.url, "retries": 2, "backoff_s": 0.1,
                                         "rate_limit": 0}))
        r = tool("q")
        assert not r.ok and r.output.startswith("Error: web search failed: HTTP 503 from searxng")
        assert "upstream down" in r.output and "after 3 attempts" in r.output
        gaps = [b.t - a.t for a, b in zip(srv.requests, srv.requests[1:], strict=False)]  # consecutive pairs
        assert len(srv.requests) == 3 and gaps[0] >= 0.09 and gaps[1] >= 0.19  # 0.1 s, then 0.2 s


def test_a_4xx_other_than_429_is_not_retried():
    with scripted_server(lambda req: (400, {}, {"error": "bad q"})) as srv:
        r = WebSearchTool(web_config({"provider": "searxng", "url": srv.url, "retries": 3, "rate_limit": 0}))("q")
        assert not r.ok and "HTTP 400" in r.output and len(srv.requests) == 1


def test_rate_limit_spaces_requests_per_provider():
    ok = (200, {}, {"results": [{"title": "T", "url": "https://e.org/t", "content": "c"}]})
    with scripted_server(lambda req: ok) as srv:
        tool = WebSearchTool(web_config({"provider": "searxng", "url": srv.url, "rate_limit": 5.0}))
        t0 = time.monotonic()
        for j in range(4):
            assert tool(f"q{j}").ok
        gaps = [b.t - a.t for a, b in zip(srv.requests, srv.requests[1:], strict=False)]  # consecutive pairs
        assert min(gaps) >= 0.14 and time.monotonic() - t0 >= 0.59  # 5 per second: 0.2 s apart (server-side jitter)
        # the same endpoint: a shared limiter
        other = WebSearchTool(web_config({"provider": "searxng", "url": srv.url, "rate_limit": 5.0}))
        assert other.limiter is tool.limiter


def test_rate_limiter_is_shared_across_threads():
    import threading

    lim, times = RateLimiter(20.0), []
    ths = [threading.Thread(target=lambda: (lim.acquire(), times.append(time.monotonic()))) for _ in range(6)]
    t0 = time.monotonic()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert max(times) - t0 >= 0.24  # six slots 50 ms apart
    assert RateLimiter(0).acquire() == 0.0


def test_retry_delay():
    assert retry_delay(0, 0.5) == 0.5 and retry_delay(2, 0.5) == 2.0
    assert retry_delay(0, 0.5, "3") == 3.0 and retry_delay(0, 0.5, "9999") == 30.0
    assert retry_delay(1, 0.5, "Wed, 21 Oct 2015 07:28:00 GMT") == 1.0


def test_unreachable_provider_and_bad_response_are_error_results():
    from arpo.ports import free_port

    down = WebSearchTool(web_config({"provider": "searxng", "url": f"http://127.0.0.1:{free_port()}", "retries": 1,
                                     "backoff_s": 0.01}))("q")
    assert not down.ok and down.output.startswith("Error: web search failed: cannot reach searxng")
    with scripted_server(lambda req: (200, {}, "<html>not json</html>")) as srv:
        bad = WebSearchTool(web_config({"provider": "searxng", "url": srv.url}))("q")
        assert not bad.ok and "bad response from searxng" in bad.output
    with scripted_server(lambda req: (200, {}, {"results": []})) as srv:
        none = WebSearchTool(web_config({"provider": "local", "url": srv.url}))("zzqx")
        assert none.ok and none.output == "No results found for 'zzqx'. Try other keywords."
        empty = WebSearchTool(web_config({"provider": "local", "url": srv.url}))("   ")
        assert not empty.ok and "empty search query" in empty.output and len(srv.requests) == 1


def test_cache_answers_identical_queries_once_and_json_format():
    ok = (200, {}, {"results": [{"title": "T", "url": "https://e.org/t", "content": "c"}]})
    with scripted_server(lambda req: ok) as srv:
        reg = build_tools(["web_search"], web={"provider": "searxng", "url": srv.url, "rate_limit": 0},
                          cache=ToolCache())
        a = reg.run(ToolCall("web_search", "Ed Wood"))
        b = reg.run(ToolCall("web_search", "  ed   WOOD "))  # the same query, normalized
        assert a.ok and b.ok and b.cached and a.output == b.output and len(srv.requests) == 1
        j = reg.run(ToolCall("web_search", '{"query": "Tim"}', arguments={"query": "Tim"}))
        assert j.ok and j.output == "1. T\nURL: https://e.org/t\nc" and srv.requests[-1].query["q"] == "Tim"
        reg.close()


def test_config_errors_name_the_key():
    with pytest.raises(ArpoError, match=r"tools.web.provider: 'bing'"):
        web_config({"provider": "bing"})
    with pytest.raises(ArpoError, match=r"unknown config key 'tools.web.topk' \(did you mean tools.web.top_k\?\)"):
        web_config({"topk": 3})
    with pytest.raises(ArpoError, match=r"tools.web.url"):
        web_config({"url": "ftp://x"})
    with pytest.raises(ArpoError, match=r"tools.web.summarizer_model"):
        web_config({"summarizer_url": "http://127.0.0.1:1/v1"})
    assert web_config(None).base_url == "http://127.0.0.1:8090"
    assert web_config({"provider": "serper"}).key_env == "SERPER_API_KEY"


def test_format_results_cuts_and_numbers():
    out = format_results([{"title": "", "url": "https://x.org", "snippet": "a  b\nc"}], snippet_chars=3)
    assert out == "1. https://x.org\nURL: https://x.org\na b…"


def test_a_provider_that_never_answers_times_out_into_an_error_result():
    import socket

    srv = socket.socket()  # accepts connections, never answers
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    try:
        tool = WebSearchTool(web_config({"provider": "searxng", "url": f"http://127.0.0.1:{srv.getsockname()[1]}",
                                         "timeout_s": 0.3, "retries": 1, "backoff_s": 0.01}))
        t0 = time.monotonic()
        r = tool("anything")
        assert not r.ok and "no answer from searxng" in r.output and "within 0.3s" in r.output
        assert "after 2 attempts" in r.output and time.monotonic() - t0 < 5
    finally:
        srv.close()
