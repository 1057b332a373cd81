"""Issue 29: every mistake a newcomer makes gets one clear line and a non-zero exit, nothing they own
is lost, and nothing goes silently wrong. Each test failed before its fix."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arpo.cli import main

ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _arpo(*args, timeout=120, **kw):
    return subprocess.run([sys.executable, "-m", "arpo", *map(str, args)], capture_output=True, text=True, env=ENV,
                          timeout=timeout, **kw)


# ---- A. no output overwrites an input -------------------------------------------------------------------------
def test_no_output_overwrites_an_input(tmp_path, capsys):
    worked = tmp_path / "w.jsonl"
    text = json.dumps({"question": "2+2?", "calls": [{"tool": "python", "arguments": {"code": "print(4)"}}],
                       "answer": "4"}) + "\n"
    worked.write_text(text)
    rc = main(["sft-data", "tools", "--data", str(worked), "--tools", "python", "--out", str(worked), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "would overwrite the input" in err and worked.read_text() == text
    # a spelling that reaches the same file, and a slice of it
    rc = main(["sft-data", "svamp", "--data", f"{tmp_path}/./w.jsonl[0:1]", "--out", str(worked), "--quiet"])
    assert rc == 2 and "would overwrite the input" in capsys.readouterr().err and worked.read_text() == text
    # an index directory (replaced as a whole) that holds its own corpus
    corpus = tmp_path / "idx" / "corpus.jsonl"
    corpus.parent.mkdir()
    corpus.write_text(json.dumps({"id": "1", "title": "t", "text": "some text"}) + "\n")
    rc = main(["index", "build", str(corpus), "--out", str(corpus.parent), "--quiet"])
    assert rc == 2 and "would overwrite the input" in capsys.readouterr().err and corpus.is_file()
    ev = tmp_path / "e1.json"
    ev.write_text(json.dumps({"results": {}}))
    rc = main(["compare", f"a={ev}", "--out", str(ev)])
    assert rc == 2 and "would overwrite the input" in capsys.readouterr().err
