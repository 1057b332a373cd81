"""examples/deep_search/README.md, "Your own corpus and questions": the recipe's commands on a tiny
MuSiQue-shaped file (each row a question, its answer and its paragraphs, two of them supporting):
`arpo web serve --corpus` serves the paragraphs as pages (a real process on 127.0.0.1), `arpo web
sft-data` makes worked trajectories through the real tools from the supporting paragraphs, `arpo
eval` evaluates the questions with the web tools (deep-search metrics in its JSON), `arpo sft` and
`arpo train` run on them (the tiny random model stands in for SmolLM2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("trafilatura")
import httpx

from arpo.cli import main
from arpo.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
FILLER = " ".join(f"Sentence {i} of the page is about nothing in particular." for i in range(8))


def _p(title: str, text: str, supporting: bool = True) -> dict:
    return {"title": title, "paragraph_text": f"{FILLER} {text}", "is_supporting": supporting}


ROWS = [
    {"id": "m1", "question": "Who founded the company that makes the Zorblax phone?", "answer": "Ada Quill",
     "paragraphs": [_p("Zorblax", "The Zorblax phone is made by Quillcorp."),
                    _p("Quillcorp", "Quillcorp was founded by Ada Quill."),
                    _p("Quillcorp Arena", "Quillcorp Arena was built by Ben Lark.", False)]},
    {"id": "m2", "question": "In which city was the author of Frost Lanterns born?", "answer": "Tarvik",
     "paragraphs": [_p("Frost Lanterns", "Frost Lanterns was written by Mira Vell."),
                    _p("Mira Vell", "Mira Vell was born in Tarvik.")]},
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("own")
    f = d / "my_musique.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-m", "arpo", "web", "serve", "--corpus", str(f), "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else "arpo web serve exited"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            pytest.fail("arpo web serve did not start")
        yield f, url, d
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_readme_recipe_on_a_musique_shaped_file(corpus, capsys):
    f, url, d = corpus
    assert httpx.get(url + "/health").json()["pages"] == 5  # every paragraph a page
    web = ["--web-url", url, "--web-top-k", "2", "--web-snippet-chars", "60", "--browse-window-chars", "300"]
    sft = d / "my_sft.jsonl"
    assert main(["web", "sft-data", "--data", str(f), *web, "--out", str(sft), "--quiet"]) == 0
    rows = [json.loads(x) for x in sft.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["m1", "m2"]
    for r, src in zip(rows, ROWS, strict=True):  # each supporting page searched and read, then the answer
        sup = [p["title"] for p in src["paragraphs"] if p["is_supporting"]]
        # the question's words first (it names the first page), then the name the first page gave
        assert [s.split("</web_search>")[0].strip() for s in r["response"].split("<web_search>")[1:]] == \
            [src["question"], sup[1]]
        assert r["response"].count("<browse>") == 2 and f"\\boxed{{{src['answer']}}}" in r["response"]
    capsys.readouterr()

    assert main(["sft", "--config", str(ROOT / "examples/deep_search/sft.yaml"), "model.name=tiny-random",
                 f"data.path=[{sft}]", "data.max_seq_len=4096", "steps=1", "prompts_per_step=2",
                 f"run.dir={d / 'my_sft'}", "run.tensorboard=false", "--quiet"]) == 0
    ev = d / "my_eval.json"  # the README evaluates the model trained on your corpus, not the example's
    assert main(["eval", "--model", str(d / "my_sft"), "--data", str(f), "--tools", "web_search,browse", "--template",
                 "deep_search", *web, "--max-response-tokens", "16", "--quiet", "--out", str(ev)]) == 0
    out = json.loads(ev.read_text())
    res = out["results"][next(iter(out["results"]))]
    assert res["questions"] == 2 and "deep_search/searches" in res and res["deep_search/supporting_opened"] == 0.0
    recs = out["records"][next(iter(out["records"]))]
    assert recs[0]["deep_search"]["supporting"] == ["Zorblax", "Quillcorp"]

    assert main(["train", "--config", str(ROOT / "examples/deep_search/train.yaml"), f"model.name={d / 'my_sft'}",
                 "model.train_layers=1", f"data.path={f}", "data.template=deep_search", f"tools.web.url={url}",
                 "steps=1", "prompts_per_step=1", "rollout.group_size=2", "rollout.initial_rollouts=1",
                 "agent.max_response_tokens=16", f"run.dir={d / 'my_arpo'}", "run.tensorboard=false", "--quiet"]) == 0
    assert (d / "my_arpo" / "metrics.jsonl").read_text().strip()
