"""serve/routes.py: the agent server's routes are module-level functions on one APIRouter, the API key a
dependency of every route but /health (issue 64 item 5: create_app was 107 lines of closures). The chat
route's key check, which moved from the handler's first line into the dependency, through a real app."""

import pytest

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def keyed(tiny_lm, tiny_tok):
    from starlette.testclient import TestClient

    from arpo.engine.hf import HFEngine
    from arpo.serve.app import create_app
    from arpo.serve.scheduler import AgentScheduler
    from arpo.settings import AgentConfig
    from arpo.tools.registry import ToolRegistry

    sched = AgentScheduler(HFEngine(tiny_lm, tiny_tok), ToolRegistry([]), AgentConfig(max_tool_calls=0))
    app = create_app(sched, tiny_tok, model_name="m", system="", context_len=2048, max_response_tokens=4,
                     api_key="sekret")
    yield TestClient(app, base_url="http://127.0.0.1")
    sched.close()


def test_the_routes_are_module_level_functions_behind_the_key_dependency():
    from arpo.serve import routes

    paths = {r.path: r for r in routes.router.routes}
    assert set(paths) == {"/health", "/v1/models", "/v1/models/{name:path}", "/v1/chat/completions"}
    for path, r in paths.items():
        assert r.endpoint is getattr(routes, r.endpoint.__name__)  # not a closure of create_app
        keyed = any(d.dependency is routes.require_key for d in r.dependencies)
        assert keyed == (path != "/health"), path


def test_chat_needs_the_key(keyed):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = keyed.post("/v1/chat/completions", json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = keyed.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = keyed.post("/v1/chat/completions", json=body | {"model": "other"}, headers={"authorization": "Bearer sekret"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = keyed.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer sekret"})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    assert keyed.get("/health").status_code == 200  # no key: liveness
    assert keyed.get("/v1/models/m").status_code == 401
    assert keyed.get("/v1/models/m", headers={"authorization": "Bearer sekret"}).json()["id"] == "m"
