"""The `arpo serve agent` command: defaults from a training run's config, the served model id, and the
server it builds (model dir, real python tool) answering the openai client."""

import socket
import threading
import time

import pytest

from arpo.commands.serve import agent_config, run_settings
from arpo.errors import ArpoError
from arpo.serve.app import agent_server, serve, served_name
from arpo.settings import ServeConfig, ToolsConfig


def _args(*argv):
    from arpo.cli import build_parser

    return build_parser().parse_args(["serve", "agent", *argv])


def test_a_run_dirs_config_gives_the_defaults_and_flags_win(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "tools: {enabled: [search], python_session: true, search_top_k: 5, cache: true}\n"
        "data: {template: search}\nagent: {max_tool_calls: 3, max_response_tokens: 256, tool_format: json}\n")
    run = run_settings(str(tmp_path))
    assert run == {"tools": {"enabled": ["search"], "python_session": True, "search_top_k": 5, "cache": True},
                   "agent": {"max_tool_calls": 3, "max_response_tokens": 256, "tool_format": "json"},
                   "template": "search"}
    cfg = agent_config(_args("--model", str(tmp_path)), run)
    assert (cfg.tools.enabled, cfg.template, cfg.agent.max_tool_calls, cfg.agent.max_response_tokens) == (
        ["search"], "search", 3, 256)
    assert (cfg.tools.python_session, cfg.agent.tool_format, cfg.tools.search_top_k, cfg.tools.search_max_chars) == (
        True, "json", 5, 300)
    assert cfg.tools.cache is False  # training's tool cache is not the server's
    cfg = agent_config(_args("--model", str(tmp_path), "--tools", "python", "--max-tool-calls", "1", "--tool-format",
                             "tags"), run, env_key="k")
    assert (cfg.tools.enabled, cfg.template, cfg.agent.max_tool_calls, cfg.agent.tool_format, cfg.api_key) == (
        ["python"], None, 1, "tags", "k")  # the run's template went with the run's tools
    assert run_settings(str(tmp_path / "nothing")) == {}
    plain = agent_config(_args(), {})
    assert (plain.tools.enabled, plain.agent.max_response_tokens, plain.agent.tool_format,
            plain.tools.python_session) == (["python"], 1024, "tags", False)
    assert (plain.agent.temperature, plain.agent.top_p, plain.agent.top_k) == (0.6, 0.95, 20)


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
    cfg = ServeConfig(model=model, port=port, tools=ToolsConfig(enabled=["python"]), log_level="warning")
    with agent_server(cfg) as server:
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
