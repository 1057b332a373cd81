"""A real `arpo web serve` on 127.0.0.1: pages with one title, the port it got (issue 42 item 8: what a
newcomer's first tries found; each test failed before its fix)."""

from __future__ import annotations


def test_web_serve_keeps_pages_with_one_title_and_prints_the_port_it_got(tmp_path):
    """`arpo web serve` dropped the second of two pages with one title, and `--port 0` never printed
    the port it listened on. A real `arpo web serve` on 127.0.0.1."""
    import json
    import os
    import re
    import subprocess
    import sys

    import httpx

    rows = [{"title": "Springfield", "text": "Springfield, Illinois is the capital of Illinois."},
            {"title": "Springfield", "text": "Springfield, Massachusetts is where basketball began."}]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    f = tmp_path / "pages.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [sys.executable, "-m", "arpo", "web", "serve", "--corpus", str(f), "--port", "0"]
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and f"{f}:2: title (its id when a row has none) 'Springfield' is already the " \
        f"title of {f}:1, with another text; give each row its own 'id'" in refused.stderr, refused.stderr
    f.write_text("".join(json.dumps({"id": f"s{i}", **r}) + "\n" for i, r in enumerate(rows)))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r" on (http://127\.0\.0\.1:(\d+)) ", line)
        assert m and m.group(2) != "0", line
        url = m.group(1)
        hits = httpx.get(f"{url}/search", params={"q": "Springfield", "format": "json"}, timeout=30).json()["results"]
        assert sorted(h["url"] for h in hits) == [f"{url}/wiki/Springfield", f"{url}/wiki/Springfield_(2)"]
        assert "basketball" in httpx.get(f"{url}/wiki/Springfield_(2)", timeout=30).text
    finally:
        proc.terminate()
        proc.wait(10)
