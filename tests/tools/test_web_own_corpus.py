"""Your own corpus through `arpo web serve` and `arpo web sft-data` (examples/deep_search/README.md),
on a small MuSiQue-shaped and a HotpotQA-shaped file written here: every paragraph is served (the
paragraphs that share a title are sections of its page, and the server says how many), the worked
trajectories follow the question's order (MuSiQue's `question_decomposition` where given) with
queries from the question's words, and `answer_aliases` are gold answers."""

import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("httpx")
pytest.importorskip("trafilatura")
import httpx
from web_servers import uvicorn_app

FILL = " ".join(f"Line {i} of this page says little that matters here." for i in range(6))


def _p(title, text, supporting=False):
    return {"title": title, "paragraph_text": f"{text} {FILL}", "is_supporting": supporting}


MUSIQUE = [
    {"id": "m1", "question": "When was the institute that owned The Collegian founded?", "answer": "1960",
     "answer_aliases": ["the year 1960"],
     # file order: the second hop's page first; The Collegian twice (two sections, the second supporting)
     "paragraphs": [_p("Houston Baptist University", "Houston Baptist University was founded in 1960 in Texas.", True),
                    _p("The Collegian", "The Collegian is printed every two weeks on recycled paper."),
                    _p("The Collegian", "The Collegian is the student newspaper owned by Houston Baptist University.",
                       True),
                    _p("Baptist Press", "Baptist Press is a news service that began in 1946.")],
     "question_decomposition": [
         {"id": 1, "question": "The Collegian >> owned by", "answer": "Houston Baptist University",
          "paragraph_support_idx": 2},
         {"id": 2, "question": "When was #1 founded?", "answer": "1960", "paragraph_support_idx": 0}]},
    {"id": "m2", "question": "Who founded the company that makes the Zorblax phone?", "answer": "Ada Quill",
     "answer_aliases": ["Ada L. Quill"],  # the page writes the alias only
     "paragraphs": [_p("Quillcorp", "Quillcorp was founded by Ada L. Quill in a garage.", True),
                    _p("Zorblax", "The Zorblax phone is made by Quillcorp.", True)]},
]


def _ctx(pairs):
    return {"title": [t for t, _ in pairs], "sentences": [[s + " ", FILL] for _, s in pairs]}


HOTPOT = [
    {"id": "h1", "question": "In which city was the author of Frost Lanterns born?", "answer": "Tarvik",
     "context": _ctx([("Mira Vell", "Mira Vell was born in Tarvik."),
                      ("Frost Lanterns", "Frost Lanterns is a novel written by Mira Vell."),
                      ("Tarvik", "Tarvik is a port on the cold sea.")]),
     "supporting_facts": {"title": ["Mira Vell", "Frost Lanterns"], "sent_id": [0, 0]}},
    {"id": "h2", "question": "Which book did Mira Vell write after her first novel?", "answer": "Ice Bells",
     # another paragraph of the page Mira Vell (HotpotQA rows of other questions carry other paragraphs)
     "context": _ctx([("Mira Vell", "Mira Vell wrote Ice Bells after her first novel."),
                      ("Tarvik", "Tarvik is a port on the cold sea.")]),
     "supporting_facts": [["Mira Vell", 0]]},
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("own")
    for name, rows in (("musique", MUSIQUE), ("hotpot", HOTPOT)):
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


@pytest.fixture(scope="module", params=["musique", "hotpot"])
def web(request, files):
    from arpo.web.server import create_app
    from arpo.web.site import Site

    f = files / f"{request.param}.jsonl"
    site = Site.from_corpus([str(f)], files / f"index-{request.param}")
    with uvicorn_app(create_app(site)) as url:
        yield request.param, f, url, site


def _search(url, q):
    return [r["title"] for r in httpx.get(f"{url}/search", params={"q": q, "format": "json"}).json()["results"]]


def test_every_paragraph_is_served_and_the_merge_is_said(web):
    shape, _, url, site = web
    if shape == "musique":
        page = httpx.get(f"{url}/wiki/The_Collegian").text
        assert "printed every two weeks" in page and "owned by Houston Baptist University" in page
        assert _search(url, "student newspaper owned")[0] == "The Collegian"
        assert len(site) == 5 and site.merged.sections == {"The Collegian": 2}
        assert site.merged.line().startswith("6 paragraphs on 5 pages: 1 paragraphs share a title")
    else:
        page = httpx.get(f"{url}/wiki/Mira_Vell").text
        assert "born in Tarvik" in page and "wrote Ice Bells" in page
        assert len(site) == 3 and site.merged.sections == {"Mira Vell": 2}  # Tarvik's copy is served once


def test_arpo_web_serve_prints_what_it_merged(files):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-m", "arpo", "web", "serve", "--corpus", str(files / "musique.jsonl"),
                             "--port", "0"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = proc.stdout.readline()  # "arpo web: N pages (...) on URL ..." (printed once it listens)
        url = re.search(r"on (http://\S+)", first)
        assert url, first
        assert httpx.get(url.group(1) + "/health", timeout=30).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
        rest = proc.stdout.read()  # (communicate would skip what readline has buffered)
        proc.stdout.close()
    lines = [first, *rest.splitlines()]
    assert "5 pages" in lines[0], lines
    assert lines[1].startswith("arpo web: 6 paragraphs on 5 pages: 1 paragraphs share a title with another"), lines
    assert "'The Collegian': 2" in lines[1]


def test_worked_trajectories_follow_the_question_with_its_words(web, tmp_path):
    from arpo.recipes.web_sft_data import build_deep_search_sft

    shape, f, url, _ = web
    out = tmp_path / "sft.jsonl"
    stats = build_deep_search_sft(str(f), str(out), web={"url": url, "top_k": 2, "window_chars": 400}, progress=False)
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    queries = {i: re.findall(r"<web_search> (.*?) </web_search>", r["response"]) for i, r in rows.items()}
    pages = {i: re.findall(r"<browse> \S+/wiki/(\S+) \|", r["response"]) for i, r in rows.items()}
    if shape == "musique":
        assert stats["written"] == 2, stats
        # the decomposition's order and its sub-questions, #1 replaced by what the first page said
        assert queries["m1"] == ["The Collegian owned by", "When was Houston Baptist University founded?"]
        assert pages["m1"] == ["The_Collegian", "Houston_Baptist_University"]
        # no decomposition: the page the question names first (by the question), then the one it led to
        assert queries["m2"] == [MUSIQUE[1]["question"], "Quillcorp"] and pages["m2"] == ["Zorblax", "Quillcorp"]
        assert rows["m2"]["answers"] == ["Ada Quill", "Ada L. Quill"]  # found on the page as its alias
        assert rows["m1"]["answers"] == ["1960", "the year 1960"]
    else:
        assert stats["written"] == 2, stats
        assert queries["h1"] == [HOTPOT[0]["question"], "Mira Vell"] and pages["h1"] == ["Frost_Lanterns", "Mira_Vell"]
        assert queries["h2"] == [HOTPOT[1]["question"]] and "\\boxed{Ice Bells}" in rows["h2"]["response"]


def test_answer_aliases_are_gold_answers(files):
    from arpo.data.datasets import load_examples
    from arpo.rewards import get_reward_fn

    ex = {e["id"]: e for e in load_examples(str(files / "musique.jsonl"))}
    assert ex["m2"]["answers"] == ["Ada Quill", "Ada L. Quill"]
    reward = get_reward_fn("arpo")
    r = reward("<think> ok </think>\n<answer> \\boxed{Ada L. Quill} </answer>", ex["m2"])
    assert r.correct and r.reward == 1.0


def test_answer_aliases_must_be_strings(tmp_path):
    from arpo.data.datasets import load_examples
    from arpo.errors import ArpoError

    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"question": "Q?", "answer": "A", "answer_aliases": "A."}) + "\n")
    with pytest.raises(ArpoError, match=r"bad.jsonl:1: field 'answer_aliases' must be a list of strings"):
        load_examples(str(f))


def test_a_decomposition_whose_last_page_writes_an_alias_is_kept(tmp_path):
    """MuSiQue's last sub-answer is the row's answer; a page that writes it as one of `answer_aliases`
    holds the answer (the recipe on a MuSiQue-shaped file dropped such rows: "a hop's answer not in
    its page read"). An earlier hop's answer still has to be on its page as written."""
    from arpo.recipes.web_sft_data import build_deep_search_sft
    from arpo.web.server import create_app
    from arpo.web.site import Site

    row = {"id": "a1", "question": "Who founded the company that makes the Zorblax phone?", "answer": "Ada Quill",
           "answer_aliases": ["A. Quill"],
           "paragraphs": [_p("Zorblax", "The Zorblax phone is made by Quillcorp.", True),
                          _p("Quillcorp", "Quillcorp was founded by A. Quill in a garage.", True)],
           "question_decomposition": [
               {"id": 1, "question": "Zorblax >> manufacturer", "answer": "Quillcorp", "paragraph_support_idx": 0},
               {"id": 2, "question": "Who founded #1?", "answer": "Ada Quill", "paragraph_support_idx": 1}]}
    wrong = {**row, "id": "a2", "question_decomposition": [  # the first hop's answer is not on its page
        {**row["question_decomposition"][0], "answer": "Zorbcorp"}, row["question_decomposition"][1]]}
    f = tmp_path / "alias.jsonl"
    f.write_text(json.dumps(row) + "\n" + json.dumps(wrong) + "\n")
    site = Site.from_corpus([str(f)], tmp_path / "index")
    out = tmp_path / "sft.jsonl"
    with uvicorn_app(create_app(site)) as url:
        stats = build_deep_search_sft(str(f), str(out), web={"url": url, "top_k": 2, "window_chars": 400},
                                      progress=False)
    assert stats["written"] == 1 and stats["dropped"] == {"a hop's answer not in its page read": 1}, stats
    got = json.loads(out.read_text())
    assert got["id"] == "a1" and "\\boxed{Ada Quill}" in got["response"] and got["answers"] == ["Ada Quill", "A. Quill"]
