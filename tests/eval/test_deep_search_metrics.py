"""Deep-search metrics (arpo/eval/deep_search.py): per trajectory the searches, pages read, whether the
supporting pages were opened and the answer's page, hand-computed; their means in `summarize`; the
supporting titles examples carry (webhop, HotpotQA, MuSiQue, a plain list); the viewer's tree. The
eval path end to end through the real tools is in tests/data/test_webhop.py."""

from __future__ import annotations

import gzip
import json

import pytest

from arpo.data.datasets import supporting_titles
from arpo.eval.deep_search import page_of, summarize, trajectory_stats

W = "http://127.0.0.1:8090/wiki"


def _page(url, title, body):
    return f"URL: {url}\nTitle: {title}\nPassages about 'q':\n{body}"


CALLS = [
    {"tool": "web_search", "input": "Belmor", "output": f"1. Belmor\nURL: {W}/Belmor\nBelmor lies…", "ok": True},
    {"tool": "browse", "input": f"{W}/Old_Belmor | twin town",
     "output": _page(f"{W}/Old_Belmor", "Old Belmor", "The twin town of Old Belmor is Drosk."), "ok": True},
    {"tool": "browse", "input": f"{W}/Belmor | twin town",
     "output": _page(f"{W}/Belmor", "Belmor", "The twin town of Belmor is Karvin."), "ok": True},
    {"tool": "browse", "input": f"{W}/Belmor page=2", "output": f"URL: {W}/Belmor\n[page 2 of 3]\nmore", "ok": True},
    {"tool": "web_search", "input": "Karvin", "output": f"1. Karvin\nURL: {W}/Karvin\nKarvin lies…", "ok": True},
    {"tool": "browse", "input": f"{W}/Nowhere | x", "output": "Error: browse failed: HTTP 404", "ok": False},
    {"tool": "browse", "input": f"{W}/Karvin | elevation",
     "output": _page(f"{W}/Karvin", "Karvin", "The elevation of Karvin is 873 metres."), "ok": True},
]


def test_trajectory_stats_hand_computed():
    s = trajectory_stats(CALLS, "873", ["Belmor", "Karvin"])
    # 2 searches; 3 distinct pages read (Old Belmor, Belmor twice = once, Karvin; the failed call none)
    assert s == {"searches": 2, "pages_read": 3, "pages": [f"{W}/Old_Belmor", f"{W}/Belmor", f"{W}/Karvin"],
                 "supporting": ["Belmor", "Karvin"], "supporting_opened": 2, "all_supporting_opened": True,
                 "answered": True, "answer_page": f"{W}/Karvin"}
    wrong = trajectory_stats(CALLS[:3], "Drosk", ["Belmor", "Karvin"])  # answered off the near-namesake's page
    assert wrong["supporting_opened"] == 1 and not wrong["all_supporting_opened"]
    assert wrong["answer_page"] == f"{W}/Old_Belmor"
    none = trajectory_stats(CALLS[:1], None, [])
    assert none == {"searches": 1, "pages_read": 0, "pages": [], "supporting": [], "supporting_opened": 0,
                    "all_supporting_opened": False, "answered": False, "answer_page": None}
    assert trajectory_stats(CALLS, "12345", ["Karvin"])["answer_page"] is None  # no page read shows it


def test_page_of_without_a_title_line_uses_the_url():
    url = f"{W}/Ed_Wood_(film)"
    assert page_of({"tool": "browse", "input": url, "ok": True,
                    "output": f"URL: {url}\n[page 1 of 1]\ntext"}) == (url, "Ed_Wood_(film)")
    assert page_of({"tool": "web_search", "input": "x", "output": "URL: y", "ok": True}) is None
    read = [{"tool": "browse", "input": url, "ok": True, "output": f"URL: {url}\ntext"}]
    assert trajectory_stats(read, None, ["Ed Wood (film)"])["supporting_opened"] == 1


def test_summarize_means():
    a = trajectory_stats(CALLS, "873", ["Belmor", "Karvin"])
    b = trajectory_stats(CALLS[:3], "Drosk", ["Belmor", "Karvin"])
    c = trajectory_stats(CALLS[:1], None, ["Belmor", "Karvin"])
    m = summarize([a, b, c])
    assert m["searches"] == pytest.approx((2 + 1 + 1) / 3) and m["pages_read"] == pytest.approx((3 + 2 + 0) / 3)
    assert m["supporting_opened"] == pytest.approx(1 / 3)  # only a opened both
    assert m["answer_on_page"] == 1.0  # of the two that answered, both answers are on a page read
    assert summarize([]) == {}
    assert "supporting_opened" not in summarize([trajectory_stats(CALLS, "873", [])])


def test_supporting_titles_of_the_row_layouts():
    assert supporting_titles({"supporting": ["A", "B", "A"]}) == ["A", "B"]
    assert supporting_titles({"supporting_facts": {"title": ["X", "X", "Y"], "sent_id": [0, 1, 0]}}) == ["X", "Y"]
    assert supporting_titles({"supporting_facts": [["X", 0], ["Y", 2]]}) == ["X", "Y"]
    assert supporting_titles({"paragraphs": [{"title": "P", "paragraph_text": "p", "is_supporting": True},
                                             {"title": "Q", "paragraph_text": "q", "is_supporting": False}]}) == ["P"]
    assert supporting_titles({"question": "q"}) == []
    from arpo.data.datasets import load_examples

    assert load_examples("webhop:dev[0:1]")[0]["supporting"] == ["Zamol", "Henhin"]
    assert len(load_examples("hotpotqa:dev[0:1]")[0]["supporting"]) == 2
    assert "supporting" not in load_examples("svamp:test[0:1]")[0]


def test_the_viewers_tree_shows_deep_search_per_path(tmp_path):
    from arpo.training.rollout_log import tree_summary
    from arpo.view.data import Catalog

    traj = {"id": 0, "parent": None, "branch_at": None, "reward": 1.0, "correct": True, "answer": "873",
            "tool_calls": CALLS, "tokens": ["a"], "mask": [1], "entropy": [0.1], "logp": [-0.1], "start": 0}
    rec = {"format": 1, "step": 1, "index": 0, "prompt_id": "p", "question": "q", "gold": ["873"],
           "supporting": ["Belmor", "Karvin"],
           "trajectories": [traj, {**traj, "id": 1, "tool_calls": [], "answer": None}]}
    f = tmp_path / "step_000001.jsonl.gz"
    with gzip.open(f, "wt") as fh:
        fh.write(json.dumps({"summary": tree_summary(rec), **rec}) + "\n")
    tree = Catalog([str(f)]).get("runs/0/steps/1/trees/0")
    ds = tree["trajectories"][0]["deep_search"]
    assert ds["searches"] == 2 and ds["pages_read"] == 3 and ds["supporting_opened"] == 2
    assert ds["answer_page"] == f"{W}/Karvin"
    assert tree["trajectories"][1]["deep_search"]["searches"] == 0
    py = [{"tool": "python", "input": "1", "output": "1", "ok": True}]
    plain = {**rec, "trajectories": [{**traj, "tool_calls": py}]}
    g = tmp_path / "step_000002.jsonl.gz"
    with gzip.open(g, "wt") as fh:
        fh.write(json.dumps({"summary": tree_summary(plain), **plain}) + "\n")
    assert "deep_search" not in Catalog([str(g)]).get("runs/0/steps/2/trees/0")["trajectories"][0]
