"""MCP servers that fail to start (issue 29): one error line that names the server and its cause, not the
SDK's "ExceptionGroup: unhandled errors in a TaskGroup" after the server's traceback on the terminal.
The case from the issue: a server written for mcp 1.x (FastMCP), started with arpo's python (mcp 2)."""

import os
import subprocess
import sys
import textwrap

import pytest

from arpo.errors import ArpoError
from arpo.tools import build_tools

pytest.importorskip("mcp")

FASTMCP_V1_SERVER = textwrap.dedent('''
    from mcp.server.fastmcp import FastMCP

    app = FastMCP("demo")

    @app.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    if __name__ == "__main__":
        app.run()
''')


@pytest.fixture()
def fastmcp_server(tmp_path):
    p = tmp_path / "fast_server.py"
    p.write_text(FASTMCP_V1_SERVER)
    return p


def test_a_fastmcp_v1_server_under_mcp2_is_one_clear_line(fastmcp_server, capfd):
    with pytest.raises(ArpoError) as e:
        build_tools([], mcp=[{"command": sys.executable, "args": [str(fastmcp_server)]}])
    msg = str(e.value)
    assert "\n" not in msg and str(fastmcp_server) in msg  # names the server
    assert "ExceptionGroup" not in msg and "TaskGroup" not in msg
    assert "No module named 'mcp.server.fastmcp'" in msg and "mcp<2" in msg  # the cause and what to do
    assert "Traceback" not in capfd.readouterr().err  # the server's traceback stays off the terminal


def test_a_crashing_server_says_what_it_printed(tmp_path):
    p = tmp_path / "crash.py"
    p.write_text("import sys\nprint('starting', file=sys.stderr)\nraise SystemExit('config file /nope missing')\n")
    with pytest.raises(ArpoError, match=r"MCP server .*crash\.py: cannot connect or list its tools: the server "
                                        r"printed: config file /nope missing$"):
        build_tools([], mcp=[{"command": sys.executable, "args": [str(p)]}])


def test_the_cli_reports_it_in_one_line(fastmcp_server, tmp_path):
    """Through `arpo rollout` (tools.mcp from the command line): rc 2, one line on stderr, no traceback."""
    r = subprocess.run([sys.executable, "-m", "arpo", "rollout", "model.name=tiny-random", "data.path=svamp:test",
                        "data.limit=1", "tools.enabled=[]",
                        f"tools.mcp=[{{command: {sys.executable}, args: [{fastmcp_server}]}}]",
                        "--out", str(tmp_path / "r.jsonl"), "--quiet"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("arpo rollout: error: MCP server") and "fastmcp" in lines[0]


@pytest.mark.skipif(not os.environ.get("ARPO_TEST_MCP1_PYTHON"),
                    reason="set ARPO_TEST_MCP1_PYTHON to a python with mcp<2 (a FastMCP v1 server's own environment)")
def test_a_fastmcp_v1_server_in_its_own_environment_works(fastmcp_server):
    """arpo's mcp 2 client with a real mcp 1.x server (its python from another venv): the protocol is the same."""
    reg = build_tools([], mcp=[{"command": os.environ["ARPO_TEST_MCP1_PYTHON"], "args": [str(fastmcp_server)]}])
    try:
        assert reg.names == ["add"] and reg["add"].call({"a": 2, "b": 3}).output == "5"
    finally:
        reg.close()
