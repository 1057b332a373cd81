"""docs/own_corpus.md's recipe, run as written: its bash block, word for word, in bash, on a
MuSiQue-shaped file from examples/deep_search/musique_shaped.py. Only sizes are added (a function
`arpo` appends them per subcommand: the tiny random model in place of SmolLM2, one step, short
answers) and the port is a free one. Checked: every command exits 0; every distinct paragraph of the
file is on the page of its title (read over HTTP from the served web); every row becomes a worked
trajectory; each `arpo eval` evaluates the run the recipe trained just before it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("trafilatura")

from arpo.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "own_corpus.md"

# what each documented command gets appended: sizes only (the tiny random model stands in for SmolLM2)
SIZES = {"sft": "model.name=tiny-random steps=1 prompts_per_step=2 run.tensorboard=false --quiet",
         "eval": "--limit 3 --max-response-tokens 16 --quiet",
         "train": ("model.train_layers=1 steps=1 prompts_per_step=1 rollout.group_size=2 rollout.initial_rollouts=1 "
                   "agent.max_response_tokens=16 run.tensorboard=false --quiet"),
         "web": "--quiet"}

# read from the served web, before the server is stopped: every distinct paragraph on its title's page
CHECK_SERVED = r'''
import html, json, sys
import httpx
url, path, out = sys.argv[1:4]
paras = {}
for line in open(path):
    for p in json.loads(line)["paragraphs"]:
        key = (p["title"], p["paragraph_text"])
        paras[key] = paras.get(key, False) or p["is_supporting"]
pages = {}
for title in {t for t, _ in paras}:
    hits = httpx.get(url + "/search", params={"q": title, "format": "json"}).json()["results"]
    page = next((h["url"] for h in hits if h["title"] == title), None)
    pages[title] = html.unescape(httpx.get(page).text) if page else ""
served = [k for k in paras if k[1] in pages[k[0]]]
json.dump({"paragraphs": len(paras), "supporting": sum(paras.values()), "titles": len(pages),
           "pages_found": sum(bool(v) for v in pages.values()), "served": len(served),
           "supporting_served": sum(paras[k] for k in served),
           "health_pages": httpx.get(url + "/health").json()["pages"]}, open(out, "w"))
'''


def recipe_block() -> str:
    """The first bash block under "## The recipe" in docs/own_corpus.md."""
    text = DOC.read_text()
    m = re.search(r"## The recipe\n.*?```bash\n(.*?)```", text, re.S)
    assert m, f"{DOC}: no bash block under '## The recipe'"
    return m.group(1)


def test_the_recipe_block_runs_as_written(tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the recipe runs from the repository's root
    # the file the page's "No file at hand?" line makes (fewer rows)
    make = re.search(r"`(python examples/deep_search/musique_shaped.py [^`]*)`", DOC.read_text())
    assert make, "docs/own_corpus.md no longer shows how to make a MuSiQue-shaped file"
    argv = shlex.split(make.group(1).replace("--rows 20", "--rows 6"))[1:]
    subprocess.run([sys.executable, *argv], cwd=tmp_path, check=True, timeout=120)
    rows = [json.loads(x) for x in (tmp_path / "my_musique.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["question_decomposition"] for r in rows)
    (tmp_path / "check_served.py").write_text(CHECK_SERVED)
    port = str(free_port())
    block = recipe_block()
    assert "8091" in block and "runs/my_sft" in block and "runs/my_arpo" in block
    py = shlex.quote(sys.executable)
    cases = "\n".join(f'    {k}) set -- "$@" {v} ;;' for k, v in SIZES.items() if k != "web")
    script = f"""set -euo pipefail
arpo() {{
  case "$1" in
{cases}
    web) [ "$2" = sft-data ] && set -- "$@" {SIZES["web"]} ;;
  esac
  {py} -m arpo "$@"
}}
{block.replace("8091", port)}
{py} check_served.py http://127.0.0.1:{port} my_musique.jsonl served.json
"""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("w") as o, err.open("w") as e:  # files, not pipes: the served web outlives bash
        p = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, stdout=o, stderr=e, start_new_session=True)
        try:
            rc = p.wait(timeout=900)
        finally:  # the backgrounded `arpo web serve` (and anything left) is in bash's process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
    stdout = out.read_text()
    assert rc == 0, (stdout[-2000:], err.read_text()[-4000:])

    served = json.loads((tmp_path / "served.json").read_text())
    assert served["paragraphs"] > served["titles"]  # pages of several sections: the case that lost paragraphs
    assert served["served"] == served["paragraphs"] and served["supporting_served"] == served["supporting"], served
    assert served["pages_found"] == served["titles"] == served["health_pages"], served
    worked = [json.loads(x) for x in (tmp_path / "my_sft.jsonl").read_text().splitlines()]
    assert [r["id"] for r in worked] == [r["id"] for r in rows]  # aliases on the page included
    for name, run in (("my_eval_sft.json", "runs/my_sft"), ("my_eval_arpo.json", "runs/my_arpo")):
        out = json.loads((tmp_path / name).read_text())
        assert out["model"] == run and (tmp_path / run / "checkpoints").is_dir(), (name, out["model"])
        res = next(iter(out["results"].values()))
        assert res["questions"] == 3 and "deep_search/searches" in res
    assert "arpo compare" in stdout and "my_eval_sft" in stdout and "my_eval_arpo" in stdout
