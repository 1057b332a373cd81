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


# ---- B. a prompt longer than the model's context: one line, at once --------------------------------------------
def test_a_prompt_past_the_context_is_refused_before_any_compute(tmp_path, capsys):
    long_q = "How many apples? " * 3000  # well past tiny-random's 2048 positions
    t0 = time.perf_counter()
    rc = main(["chat", "--model", "tiny-random", "--tools", "python", long_q])
    err = capsys.readouterr().err
    assert rc == 2 and "this model's context holds 2048" in err and "tokens" in err, err[-2000:]
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "2+2?", "answer": "4", "task": "math"}) + "\n"
                    + json.dumps({"id": "long-one", "question": long_q, "answer": "4", "task": "math"}) + "\n")
    rc = main(["eval", "--model", "tiny-random", "--data", str(data), "--quiet", "--max-response-tokens", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and "the prompt of long-one has" in err and "context holds 2048" in err, err[-2000:]
    assert time.perf_counter() - t0 < 60
