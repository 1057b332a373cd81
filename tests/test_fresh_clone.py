"""What a fresh-clone pass over the README's and examples/' commands found (issue 29): the README's
snippets run as shown, and the commands' output says what it means."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python_block(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "tools.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if b.startswith(marker)]
    return block


def test_the_bring_your_own_tool_snippet_runs(tmp_path, monkeypatch):
    """`# mytools.py` as printed, then `--tools mytools:lookup_order`: the tool answers (it used to
    use a DB it never defined, so every call was a NameError result)."""
    from arpo.tools import build_tools

    (tmp_path / "mytools.py").write_text(_python_block("# mytools.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mytools", raising=False)
    reg = build_tools(["mytools:lookup_order"])
    try:
        res = reg["lookup_order"].call({"order_id": "A-1042"})
        assert res.ok and "Error" not in res.output and res.output != "no such order", res.output
        assert reg["lookup_order"].call({"order_id": "Z-0"}).output == "no such order"
    finally:
        reg.close()


def test_analyze_entropy_says_why_a_number_is_missing(tmp_path, capsys):
    """`arpo analyze entropy` on a dump without tool results printed 'after a tool result None'."""
    import json

    from arpo.cli import main

    dump = tmp_path / "r.jsonl"
    dump.write_text(json.dumps({"prompt_id": "p", "traj_id": 0, "parent_id": None, "response_token_ids": [1, 2],
                                "loss_mask": [1, 1], "entropies": [0.5, 0.7]}) + "\n")
    assert main(["analyze", "entropy", str(dump)]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "after a tool result n/a (no tool results in the dump)" in out


def test_index_build_without_a_terminal_prints_plain_lines(tmp_path, capsys):
    """Piped or logged, `arpo index build` wrote bm25s' tqdm bars (carriage returns, it/s) to stderr."""
    import json

    from arpo.cli import main

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "title": f"T{i}", "text": f"document number {i}"}) + "\n"
                              for i in range(50)))
    assert main(["index", "build", str(corpus), "--out", str(tmp_path / "idx")]) == 0
    io = capsys.readouterr()
    assert json.loads(io.out)["docs"] == 50
    assert "loaded 50 documents" in io.err and "\r" not in io.err and "it/s" not in io.err, io.err


def _descendants(pid: int) -> list[int]:
    import os

    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def test_ctrl_c_does_not_kill_the_python_sandbox(capfd):
    """Ctrl-C reaches every process of the terminal's foreground group, the sandbox's zygote and its
    ready workers too: they died with a KeyboardInterrupt traceback, and the calls of the step that
    train finishes after Ctrl-C failed ('python tool failed', BrokenPipeError). The trainer decides
    when to stop; the sandbox ignores SIGINT."""
    import os
    import signal
    import time

    from arpo.tools.python import PythonTool

    tool = PythonTool(pool_size=2)
    try:
        assert tool.run("print(1)").output == "1"
        tool._state.wait_full(2, time.monotonic() + 60)
        zygote = tool._state.zygote.proc.pid
        procs = _descendants(zygote)
        assert len(procs) >= 2  # the zygote and at least one ready worker
        for p in procs:
            try:
                os.kill(p, signal.SIGINT)
            except ProcessLookupError:
                pass
        time.sleep(1.0)
        assert tool._state.zygote.proc.poll() is None, "the zygote died of SIGINT"
        results = [tool.run(f"print({i} * 7)") for i in range(3)]
        assert [r.output for r in results] == ["0", "7", "14"] and all(r.ok for r in results)
    finally:
        tool.close()
    assert "Traceback" not in capfd.readouterr().err
