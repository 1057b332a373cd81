"""Tools that block, raise, print or close early fail in one line and let the process exit (issue 42 item 8:
what a newcomer's first tries found; each test failed before its fix)."""

from __future__ import annotations

import time

from arpo.cli import main


def test_a_plug_in_tool_that_blocks_does_not_keep_the_process_alive(tmp_path):
    """A plug-in tool that blocks printed its timeout, then the process never exited: the call's
    worker thread was joined at exit (train, eval, chat and serve share the path)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "blocker.py"
    script.write_text(
        "import threading\n"
        "from arpo.settings import ToolOptions\nfrom arpo.tools.plugins.function import FunctionTool\n"
        "def stuck(x: str) -> str:\n"
        "    '''Never returns.\n\n    Args:\n        x: anything\n    '''\n"
        "    threading.Event().wait()\n"
        "t = FunctionTool(stuck, options=ToolOptions(timeout_s=0.3))\n"
        "r = t.call({'x': 'a'})\n"
        "print(r.ok, r.output)\n"
        "t.close()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0 and "False Error: tool stuck timed out after 0.3 s" in out.stdout, out


def test_a_class_tool_whose_constructor_raises_is_one_line(tmp_path, monkeypatch, capsys):
    """A class tool whose constructor raises gave a traceback in `arpo tool`, train and chat."""
    import sys

    (tmp_path / "badtools.py").write_text(
        "class Shop:\n"
        "    '''A shop.'''\n"
        "    def __init__(self):\n"
        "        raise ConnectionError('database is down')\n"
        "    def __call__(self, order_id: str) -> str:\n"
        "        '''Look up.\n\n        Args:\n            order_id: the order\n        '''\n"
        "        return 'x'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "badtools", raising=False)
    rc = main(["tool", "badtools:Shop", '{"order_id": "1"}'])
    err = capsys.readouterr().err
    assert rc == 2 and "tool class badtools:Shop: its constructor raised ConnectionError: database is down" in err
    assert "Traceback" not in err


def test_a_tool_closed_while_its_sandbox_starts_prints_no_traceback(tmp_path):
    """A command that fails right after building the python tool (`arpo sft-data svamp --data
    hotpotqa:train`) printed the zygote's BrokenPipeError traceback at exit."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for pause in (0.3, 0.6, 1.0):  # closed while the zygote imports its preloads, before it says hello
        script = ("import time\nfrom arpo.tools.python import PythonTool\n"
                  f"t = PythonTool()\ntime.sleep({pause})\nt.close()\n")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr


def test_an_mcp_server_printing_to_stdout_fails_at_once_in_one_line(tmp_path, capfd):
    """An MCP server that printed to stdout dumped the SDK's traceback and failed 45 s later with
    "initialize timed out" (its text ran into the reply to initialize)."""
    import sys

    import pytest

    from arpo.errors import ArpoError
    from arpo.tools import build_tools

    pytest.importorskip("mcp")
    p = tmp_path / "noisy_server.py"
    p.write_text("import sys\nfrom mcp.server.mcpserver import MCPServer\n"
                 "app = MCPServer('noisy', log_level='CRITICAL')\n"
                 "sys.stdout.write('loading my database... '); sys.stdout.flush()\n"
                 "@app.tool()\ndef add(a: int, b: int) -> int:\n    '''Add.'''\n    return a + b\n"
                 "app.run()\n")
    t0 = time.perf_counter()
    with pytest.raises(ArpoError, match=r"noisy_server\.py: .*wrote a line that is not JSON-RPC to its stdout "
                                        r"\('loading my database"):
        build_tools([], mcp=[{"command": sys.executable, "args": [str(p)], "timeout_s": 5}],)
    assert time.perf_counter() - t0 < 40
    assert "Traceback" not in capfd.readouterr().err
