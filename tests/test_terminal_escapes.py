"""Issue 27, item 4: `arpo tool` and `arpo chat` never write a tool's (or model's) control sequences
raw to a terminal; `--json` stays exact."""

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

from arpo.terminal import visible

SRC = str(Path(__file__).resolve().parents[1] / "src")
# recolour, set the window title, clear the screen, overwrite the line, one-byte CSI, bidi override
NASTY = "\x1b[31mRED\x1b]0;pwned\x07\x1b[2J\rover\x9b1m\u202eevil"
CODE = "print(" + repr(NASTY) + ")"


def _on_pty(args: list[str]) -> bytes:
    """Run `python -m arpo ARGS` with a pseudo-terminal as its stdout and stderr; all it wrote."""
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1", TERM="xterm-256color", COLUMNS="200")
    p = subprocess.Popen([sys.executable, "-m", "arpo", *args], stdin=subprocess.DEVNULL, stdout=slave,
                         stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = b""
    while True:
        r, _, _ = select.select([master], [], [], 120)
        if not r:
            p.kill()
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    p.wait(timeout=60)
    os.close(master)
    return out


def test_visible_escapes_control_characters_and_keeps_text():
    assert visible(NASTY) == "\\x1b[31mRED\\x1b]0;pwned\\x07\\x1b[2J\\rover\\x9b1m\\u202eevil"
    assert visible("a\tb\nc \\x1b é ✓") == "a\tb\nc \\x1b é ✓"  # tab, newline, text and backslashes stay


def test_arpo_tool_shows_escapes_on_a_terminal_and_json_stays_exact():
    shown = _on_pty(["tool", "python", CODE]).decode("utf-8", "replace")
    assert "\x1b" not in shown and "\x9b" not in shown and "\u202e" not in shown, repr(shown)
    assert "\\x1b[31mRED\\x1b]0;pwned\\x07" in shown and "\\u202eevil" in shown
    raw = subprocess.run([sys.executable, "-m", "arpo", "tool", "python", "--json", CODE], capture_output=True,
                         env=dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1"), timeout=120)
    assert json.loads(raw.stdout)["output"] == NASTY  # exact
    piped = subprocess.run([sys.executable, "-m", "arpo", "tool", "python", CODE], capture_output=True,
                           env=dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1"), timeout=120)
    assert piped.stdout.decode() == NASTY + "\n"  # a pipe gets the program's bytes


def test_chat_transcript_shows_escapes_on_a_terminal(tiny_tok):
    """The transcript `arpo chat` prints: model text and tool output, rendered by rich to a terminal."""
    import io

    from rich.console import Console

    from arpo.commands.chat import print_transcript
    from arpo.rollout.agent import ToolCallRecord, Trajectory
    from arpo.tools.base import format_result

    model = ["<think> go \x1b]52;c;Y2xpcA==\x07</think><python>x</python>", " <answer> \\boxed{1} </answer>"]
    ids0, res, ids1 = (tiny_tok.encode(t, add_special_tokens=False) for t in (model[0], format_result(NASTY), model[1]))
    call = ToolCallRecord("python", "x", NASTY, True, 0.1, result_span=(len(ids0), len(ids0) + len(res)))
    ids = ids0 + res + ids1
    traj = Trajectory(0, [], ids, [1] * len(ids0) + [0] * len(res) + [1] * len(ids1), [0.0] * len(ids),
                      [0.0] * len(ids), tiny_tok.decode(ids), [call], "answer")
    buf = io.StringIO()
    print_transcript(tiny_tok, traj, "Q?", 1.0, console=Console(file=buf, force_terminal=True, width=200))
    shown = buf.getvalue()
    # rich's own styling escapes are there; none of the content's: no OSC (title, clipboard), no CSI 2J
    assert "\x1b]" not in shown and "\x1b[2J" not in shown and "\x9b" not in shown and "\r" not in shown
    assert "\\x1b]52;c;Y2xpcA==\\x07" in shown and "\\x1b]0;pwned\\x07" in shown
