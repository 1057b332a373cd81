"""One agent section and one tools section behind every agent command (settings/agent.py,
commands/agent_flags.py): the same defaults everywhere (--help shows them), a run dir's tools (MCP
servers and plug-in tools included) in chat, eval and serve agent, --tools-config, `arpo tool` with
your own tool and an MCP tool, and train's names (steps, prompts_per_step) in sft."""

import json
import re
import socket
import sys
import textwrap
import time
import urllib.request

import pytest
import yaml

from arpo.cli import build_parser, main
from arpo.settings import SFTConfig

# what each agent command is called with on the command line (after `arpo`), and its settings name
COMMANDS = {"chat": ["chat", "q"], "eval": ["eval", "--data", "x"], "serve": ["serve", "agent"],
            "sft-data": ["sft-data", "gsm8k", "--data", "x", "--out", "y"], "tool": ["tool", "python", "1"]}


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())  # one line: argparse wraps the help text


def _default(help_text: str, flag: str) -> str:
    """The last value in `flag`'s `(default: ...)` ("the run's, else the template's, else 1024" -> 1024)."""
    options = help_text.split("options:", 1)[1]  # not the usage line
    m = re.search(re.escape(flag) + r" [A-Z_]+ (.*?)\(default: ([^)]*)\)", options)
    assert m, f"{flag}: no default in its help"
    return m.group(2).rsplit("else ", 1)[-1].strip()


def test_every_agent_command_shows_the_same_defaults_in_its_help(capsys):
    """Each command's parser, built as the CLI builds it: the shared budgets, caps and search sizes have
    one default (the dataclass's), and the ones a command changes are the documented overrides."""
    flags = ("--max-response-tokens", "--max-tool-calls", "--search-top-k", "--search-max-chars")
    seen: dict[str, dict[str, str]] = {}
    for name, argv in COMMANDS.items():
        text = _help(argv[:2] if name == "serve" else argv[:1], capsys)
        seen[name] = {flag: _default(text, flag) for flag in flags if f"{flag} " in text}
        for flag in ("--temperature", "--top-p", "--top-k", "--seed"):
            if f"{flag} " in text:  # every --help shows the default (0 included)
                assert _default(text, flag) != "", (name, flag)
    # the budget is train's 1024 in every command (eval and chat had 512, serve 1024)
    assert [seen[c].get("--max-response-tokens") for c in ("chat", "eval", "serve", "sft-data")] == ["1024"] * 4
    for flag in flags[1:]:
        assert len({seen[c][flag] for c in ("chat", "eval", "serve")}) == 1, flag
    assert _default(_help(["eval"], capsys), "--temperature") == "0.0"  # eval's override: greedy

    from arpo.settings import COMMAND_DEFAULTS, AgentConfig, ToolsConfig

    agent, tools = AgentConfig(), ToolsConfig()
    shared = {"--max-response-tokens": agent.max_response_tokens, "--max-tool-calls": agent.max_tool_calls,
              "--search-top-k": tools.search_top_k, "--search-max-chars": tools.search_max_chars}
    assert agent.max_response_tokens == 1024
    for name, values in seen.items():  # a command differs only where COMMAND_DEFAULTS says so
        for flag, shown in values.items():
            want = COMMAND_DEFAULTS[name].get("agent", {}).get(flag[2:].replace("-", "_"), shared[flag])
            assert shown == str(want), (name, flag, shown)


def test_every_agent_command_resolves_the_same_agent_section():
    """The resolved settings: the dataclass's defaults with only each command's documented overrides."""
    from dataclasses import asdict

    from arpo.commands.agent_flags import resolve
    from arpo.settings import COMMAND_DEFAULTS, AgentConfig, ToolsConfig

    for name, argv in COMMANDS.items():
        r = resolve(build_parser().parse_args(argv), name)
        over = COMMAND_DEFAULTS[name]
        assert asdict(r.agent) == asdict(AgentConfig(**over.get("agent", {}))), name
        want = asdict(ToolsConfig(**over.get("tools", {})))
        got = asdict(r.tools)
        assert {k: v for k, v in got.items() if k != "enabled"} == {k: v for k, v in want.items() if k != "enabled"}


# ---- a real MCP server (stdio) and a run dir whose config names it ---------------------------------
MCP_SERVER = textwrap.dedent('''
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("arpo-test", log_level="CRITICAL")

    @app.tool()
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    if __name__ == "__main__":
        app.run()
''')


@pytest.fixture(scope="module")
def mcp_run(tmp_path_factory):
    """A train-style run dir (config.yaml: tools.enabled [python] plus an MCP server, a template) with a
    tiny random model as its checkpoint; returns (run dir, checkpoint, the MCP server entry)."""
    pytest.importorskip("mcp")
    from arpo.testing import save_tiny_model

    root = tmp_path_factory.mktemp("mcp_run")
    server = root / "server.py"
    server.write_text(MCP_SERVER)
    entry = {"command": sys.executable, "args": [str(server)]}
    run = root / "run"
    ckpt = run / "checkpoints" / "step_000001" / "model"
    save_tiny_model(ckpt)
    (ckpt.parent / "state.json").write_text("{}")  # a complete checkpoint (runs.latest_checkpoint)
    (run / "config.yaml").write_text(yaml.safe_dump(
        {"tools": {"enabled": ["python"], "mcp": [entry], "cache": True},
         "agent": {"max_tool_calls": 2, "max_response_tokens": 300, "temperature": 1.0},
         "data": {"template": "math"}}))
    return run, ckpt, entry


def test_chat_takes_a_runs_mcp_tools_with_the_flag(mcp_run, capsys):
    run, ckpt, _ = mcp_run
    # a run dir is data: without --trust-run-config its server is not started (issue 37), and said so
    assert main(["chat", "--model", str(ckpt), "--max-response-tokens", "2", "--device", "cpu", "--json", "hi"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out.strip().splitlines()[-1])["settings"]["tools"] == ["python"]
    assert "tools.mcp[0]: starts the command" in cap.err and "--trust-run-config" in cap.err
    assert main(["chat", "--model", str(ckpt), "--trust-run-config", "--max-response-tokens", "2", "--device", "cpu",
                 "--json", "hi"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    s = out["settings"]
    assert s["tools"] == ["python", "multiply"] and s["template"] == "math" and s["max_tool_calls"] == 2
    assert s["temperature"] == 0.6  # a run's sampling is train's exploration: chat keeps its own


def test_eval_takes_a_runs_mcp_tools_with_the_flag(mcp_run, tmp_path, capsys):
    run, ckpt, _ = mcp_run
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question": "2+2?", "answer": "4", "task": "math"}) + "\n")
    out = tmp_path / "e.json"
    assert main(["eval", "--model", str(run), "--data", str(q), "--max-response-tokens", "2", "--device", "cpu",
                 "--quiet", "--out", str(out), "--trust-run-config"]) == 0
    res = json.loads(out.read_text())
    assert res["results"][str(q)]["tools"] == ["python", "multiply"]
    assert res["settings"]["max_tool_calls"] == 2 and res["settings"]["mcp"] == [mcp_run[2]]


def test_chat_and_eval_take_mcp_tools_from_tools_config(mcp_run, tmp_path, capsys):
    _, _, entry = mcp_run
    cfg = tmp_path / "tools.yaml"
    cfg.write_text(yaml.safe_dump({"tools": {"enabled": [], "mcp": [entry]}}))  # a train config's shape works
    assert main(["chat", "--model", "tiny-random", "--tools-config", str(cfg), "--max-response-tokens", "2",
                 "--json", "hi"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["settings"]["tools"] == ["multiply"]
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question": "2+2?", "answer": "4", "task": "math"}) + "\n")
    out = tmp_path / "e.json"
    cfg.write_text(yaml.safe_dump({"mcp": [entry]}))  # or the section's keys at the top level
    assert main(["eval", "--model", "tiny-random", "--data", str(q), "--tools", "python", "--tools-config", str(cfg),
                 "--max-response-tokens", "2", "--quiet", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["results"][str(q)]["tools"] == ["python", "multiply"]


def test_serve_agent_keeps_a_runs_mcp_tools_with_the_flag(mcp_run):
    """`arpo serve agent --model RUN_DIR --trust-run-config`, a real server process: GET /v1/models lists
    the run's MCP tool (it used to serve the run's enabled tools only), and stderr said what it started."""
    import os
    import subprocess

    pytest.importorskip("fastapi")
    run, _, _ = mcp_run
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "arpo", "serve", "agent", "--model", str(run), "--port", str(port),
                             "--device", "cpu", "--log-level", "warning", "--trust-run-config"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline, card = time.time() + 180, None
        while card is None and proc.poll() is None and time.time() < deadline:
            try:
                card = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read())
            except OSError:
                time.sleep(0.5)
        assert card is not None, proc.stderr.read() if proc.poll() is not None else "no answer in 180 s"
        assert card["data"][0]["tools"] == ["python", "multiply"]
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert "with tools python, multiply" in out
    assert f"tools.mcp[0]: starts the command: {sys.executable}" in err


# ---- `arpo tool` with your own tool and an MCP server's --------------------------------------------
def test_arpo_tool_runs_a_plugin_tool_and_an_mcp_tool(mcp_run, tmp_path, monkeypatch, capsys):
    (tmp_path / "cli_settings_shop.py").write_text(textwrap.dedent('''
        def lookup_order(order_id: str, verbose: bool = False) -> str:
            """Look up an order.

            Args:
                order_id: the order number
                verbose: include the line items
            """
            return f"order {order_id}: shipped" + (" (2 items)" if verbose else "")
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["tool", "cli_settings_shop:lookup_order", '{"order_id": "A17", "verbose": true}']) == 0
    assert capsys.readouterr().out.strip() == "order A17: shipped (2 items)"
    assert main(["tool", "cli_settings_shop:lookup_order", '{"order": 1}', "--json"]) == 1  # a bad call: ok false
    assert json.loads(capsys.readouterr().out)["ok"] is False
    cfg = tmp_path / "mcp.yaml"
    cfg.write_text(yaml.safe_dump({"mcp": [mcp_run[2]]}))
    assert main(["tool", "multiply", '{"a": 6, "b": 7}', "--tools-config", str(cfg)]) == 0
    assert capsys.readouterr().out.strip() == "42"
    assert main(["tool", "divide", "{}", "--tools-config", str(cfg)]) == 2
    assert "no tool 'divide' here; the MCP servers of --tools-config offer: multiply" in capsys.readouterr().err
    assert main(["tool", "divide", "{}"]) == 2
    assert "unknown tool 'divide'" in capsys.readouterr().err


# ---- train's names in sft --------------------------------------------------------------------------
def test_sft_uses_trains_names_and_reads_the_old_ones_with_a_warning(capsys):
    from arpo.config import load_config
    from arpo.errors import ArpoError
    from arpo.settings import SFTConfig

    cfg = load_config(SFTConfig, None, ["steps=3", "prompts_per_step=2"])
    assert (cfg.steps, cfg.prompts_per_step) == (3, 2) and capsys.readouterr().err == ""
    old = load_config(SFTConfig, None, ["max_steps=3", "batch_size=2"])
    assert (old.steps, old.prompts_per_step) == (3, 2)
    err = capsys.readouterr().err
    assert "max_steps is deprecated, use steps" in err and "batch_size is deprecated, use prompts_per_step" in err
    with pytest.raises(ArpoError, match="max_steps and steps are the same key"):
        load_config(SFTConfig, None, ["max_steps=3", "steps=4"])


def test_a_run_saved_with_the_old_names_resumes_with_the_new(tmp_path, capsys):
    from arpo.config import load_config
    from arpo.recipes import sft

    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "response": "<answer> \\boxed{2} </answer>"}) + "\n")
    run = tmp_path / "run"
    base = ["model.name=tiny-random", f"data.path=[{data}]", f"run.dir={run}", "run.tensorboard=false"]
    sft.run(load_config(SFTConfig, None, base + ["prompts_per_step=1", "steps=1"]), quiet=True)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["max_steps"], saved["batch_size"] = saved.pop("steps"), saved.pop("prompts_per_step")
    (run / "config.yaml").write_text(yaml.safe_dump(saved))  # as an SFT run of before the rename wrote it
    sft.run(load_config(SFTConfig, None, base + ["prompts_per_step=1", "steps=2"]), resume=True, quiet=True)
    assert (run / "checkpoints" / "step_000002").is_dir()
