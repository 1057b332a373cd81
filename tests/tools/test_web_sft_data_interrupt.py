"""Ctrl-C of `arpo web sft-data` keeps the worked rows made so far (written to --out, exit 130); it
threw them away."""

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("httpx")
pytest.importorskip("trafilatura")
from web_servers import uvicorn_app

FILL = " ".join(f"Line {i} of this page says little that matters here." for i in range(6))


def _row(i):
    return {"id": f"r{i}", "question": f"Who founded the company that makes the Zorblax{i} phone?",
            "answer": f"Ada Quill{i}",
            "paragraphs": [{"title": f"Zorblax{i}", "paragraph_text": f"The Zorblax{i} phone is made by Quillcorp{i}. "
                            + FILL, "is_supporting": True},
                           {"title": f"Quillcorp{i}", "paragraph_text": f"Quillcorp{i} was founded by Ada Quill{i}. "
                            + FILL, "is_supporting": True}]}


def test_ctrl_c_keeps_the_rows_made(tmp_path):
    from arpo.web.server import create_app
    from arpo.web.site import Site

    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps(_row(i)) + "\n" for i in range(200)))
    site = Site.from_corpus([str(f)], tmp_path / "index")
    out = tmp_path / "sft.jsonl"
    with uvicorn_app(create_app(site)) as url:
        p = subprocess.Popen([sys.executable, "-m", "arpo", "web", "sft-data", "--data", str(f), "--web-url", url,
                              "--web-top-k", "2", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        for line in p.stderr:  # the plain progress line at 10 %: 20 rows made
            if line.startswith("deep-search trajectories: 20/200"):
                p.send_signal(signal.SIGINT)
                break
        stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stderr[-2000:]
    stats = json.loads(stdout)
    rows = out.read_text().splitlines()
    assert stats["interrupted"] and 20 <= stats["written"] == len(rows) < 200, stats
    assert "interrupted; the" in stderr and "rows made are kept" in stderr
