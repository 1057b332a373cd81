"""The newcomer's last tracebacks (issue 62) are one line each, exit status 2: `arpo web serve --port
99999`, a non-UTF-8 byte in `--tools-config`, a non-UTF-8 question to `arpo chat` (an argument or
standard input), and `arpo sft-data hop2` on rows that are not hop2's."""

import json
import subprocess
import sys

from arpo.cli import main


def _one_line(capsys, *needles):
    err = capsys.readouterr().err.strip().splitlines()
    last = err[-1] if err else ""
    assert all(n in last for n in needles) and "Traceback" not in "\n".join(err), err
    return last


def test_web_serve_port_out_of_range(capsys):
    try:
        rc = main(["web", "serve", "--port", "99999"])
    except SystemExit as e:  # argparse's own exit
        rc = e.code
    assert rc == 2
    _one_line(capsys, "--port", "must be <= 65535, got 99999")


def test_non_utf8_tools_config_and_question(tmp_path, capsys):
    bad = tmp_path / "tools.yaml"
    bad.write_bytes(b"tools:\n  enabled: [py\xffthon]\n")
    assert main(["chat", "--model", "tiny-random", "--tools-config", str(bad), "hi"]) == 2
    _one_line(capsys, f"--tools-config {bad}:2: not UTF-8 text")
    q = "What \udcff is 2+2?"  # a non-UTF-8 byte in argv, as Python decodes it (surrogateescape)
    assert main(["chat", "--model", "tiny-random", q]) == 2
    _one_line(capsys, "the question is not UTF-8 text")
    p = subprocess.run([sys.executable, "-m", "arpo", "chat", "--model", "tiny-random", "-"],
                       input=b"What \xff is 2+2?", capture_output=True, timeout=120)
    assert p.returncode == 2 and b"the question is not UTF-8 text" in p.stderr and b"Traceback" not in p.stderr, \
        p.stderr[-1500:]


def test_sft_data_hop2_on_rows_that_are_not_hop2(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"id": "q1", "question": "Who wrote Hamlet?", "answer": "Shakespeare"}) + "\n")
    assert main(["sft-data", "hop2", "--data", str(rows), "--out", str(tmp_path / "o.jsonl"), "--quiet"]) == 2
    _one_line(capsys, "hop2: row q1: 'Who wrote Hamlet?' is not a hop2 question")
