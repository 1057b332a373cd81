"""The `arpo serve agent` command: defaults from a training run's config, the served model id, and the
server it builds (model dir, real python tool) answering the openai client."""

import argparse
import socket
import threading
import time

import pytest

from arpo.commands.serve import agent_config, run_defaults
from arpo.errors import ArpoError
from arpo.serve.app import ServeConfig, agent_server, serve, served_name


def _args(**kw):
    base = dict(model="m", served_model_name=None, tools=None, session=None, tool_format=None, template=None,
                max_tool_calls=None, max_response_tokens=None, temperature=0.6, top_p=0.95, top_k=20, engine="hf",
                device="auto", max_batch=64, search_index=None, search_url=None, search_top_k=None,
                search_max_chars=None, api_key=None, host="127.0.0.1", port=8000, log_level="info")
    return argparse.Namespace(**(base | kw))


def test_a_run_dirs_config_gives_the_defaults_and_flags_win(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "tools: {enabled: [search], python_session: true, search_top_k: 5, cache: true}\n"
        "data: {template: search}\nagent: {max_tool_calls: 3, max_response_tokens: 256, tool_format: json}\n")
    run = run_defaults(str(tmp_path))
    assert run == {"tools": ["search"], "session": True, "search_top_k": 5, "tool_format": "json",
                   "max_tool_calls": 3, "max_response_tokens": 256, "template": "search"}
    cfg = agent_config(_args(model=str(tmp_path)), run)
    assert (cfg.tools, cfg.template, cfg.max_tool_calls, cfg.max_response_tokens) == (["search"], "search", 3, 256)
    assert (cfg.python_session, cfg.tool_format, cfg.search_top_k, cfg.search_max_chars) == (True, "json", 5, 300)
    cfg = agent_config(_args(model=str(tmp_path), tools="python", max_tool_calls=1, tool_format="tags"), run,
                       env_key="k")
    assert (cfg.tools, cfg.template, cfg.max_tool_calls, cfg.tool_format, cfg.api_key) == (
        ["python"], None, 1, "tags", "k")  # the run's template went with the run's tools
    assert run_defaults(str(tmp_path / "nothing")) == {}
    plain = agent_config(_args(), {})
    assert (plain.tools, plain.max_response_tokens, plain.tool_format, plain.python_session) == (
        ["python"], 1024, "tags", False)


def test_bad_flags_are_argparse_errors(capsys):
    from arpo.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "agent", "--top-p", "0"])
    assert "--top-p" in capsys.readouterr().err


def test_served_model_id(tmp_path):
    run = tmp_path / "arpo_gsm8k"
    (run / "checkpoints" / "step_000004" / "model").mkdir(parents=True)
    assert served_name(str(run)) == "arpo_gsm8k"
    assert served_name(str(run / "checkpoints" / "step_000004" / "model")) == "arpo_gsm8k"
    assert served_name("smollm2-135m-instruct") == "smollm2-135m-instruct"


def test_a_busy_port_is_a_clear_error_before_loading_anything():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
        with pytest.raises(ArpoError, match=f"cannot listen on 127.0.0.1:{port}"):
            serve(ServeConfig(model="/nonexistent", port=port))


def test_the_server_loads_a_model_dir_with_real_tools(tmp_path):
    openai = pytest.importorskip("openai")
    from arpo.testing import save_tiny_model

    model = save_tiny_model(tmp_path / "tiny-run")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with agent_server(ServeConfig(model=model, port=port, tools=["python"], log_level="warning")) as server:
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            assert _until(lambda: server.started or not thread.is_alive()) and server.started
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=30)
            models = client.models.list().data
            assert [m.id for m in models] == ["tiny-run"] and models[0].model_extra["tools"] == ["python"]
            assert models[0].model_extra["context_length"] == 2048
            r = client.chat.completions.create(model="tiny-run", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=6, seed=0)
            assert r.usage.completion_tokens <= 6 and r.choices[0].finish_reason in ("stop", "length")
            client.close()
        finally:
            server.should_exit = True
            thread.join(10)
    assert not thread.is_alive()


def _until(cond, timeout=60.0):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            return False
        time.sleep(0.02)
    return True
