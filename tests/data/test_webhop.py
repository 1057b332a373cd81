"""The webhop dataset (arpo/data/webhop.py), checked through a real `arpo web serve --corpus webhop:pages`
on 127.0.0.1 (one server for the file) with the real web_search and browse tools over HTTP: the shipped
files match the generator; for EVERY question the scripted two-hop trajectory gets reward 1.0, and an
answer made from the first page (any number on it, every window read) or from the search snippets
alone gets 0; `arpo web sft-data` writes the scripted trajectories."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("httpx")
pytest.importorskip("trafilatura")

from arpo.data import webhop
from arpo.data.datasets import load_examples
from arpo.rewards import arpo_reward
from arpo.sft.web import webhop_trajectory


@pytest.fixture(scope="module")
def web():
    """`arpo web serve --corpus webhop:pages` as a real process (arpo.web.process); yields its base URL."""
    from arpo.web.process import served_web

    with served_web("webhop:pages") as url:
        yield url


@pytest.fixture(scope="module")
def tools(web):
    from arpo.tools import build_tools

    reg = build_tools(list(webhop.TOOLS), web={"url": web, **webhop.WEB})
    yield reg
    reg.close()


def _reward(text: str, ex: dict, spans=None) -> float:
    calls = [{"tool": t, "ok": True} for t in re.findall(r"<(web_search|browse)>", text)]
    res = arpo_reward(text, ex, tools=list(webhop.TOOLS), tool_spans=spans, tool_calls=calls)
    assert res.format_ok, (text, res)
    return res.reward


def test_shipped_files_are_the_generators_output():
    for name, data in webhop.files().items():
        assert (webhop.data_dir() / name).read_bytes() == data, f"{name}: rerun python -m arpo.data.webhop"


def test_splits_sizes_and_disjoint_first_hops():
    rows = {s: webhop.read_jsonl_gz(webhop.data_dir() / f"{s}.jsonl.gz") for s in webhop.SPLITS}
    assert all(len(load_examples(f"webhop:{s}")) == len(rows[s]) for s in webhop.SPLITS)
    assert {s: len(r) for s, r in rows.items()} == {"train": 240, "dev": 60, "test": 60}
    hops = {s: {r["hop1"] for r in rs} for s, rs in rows.items()}
    assert not (hops["train"] & hops["dev"]) and not (hops["train"] & hops["test"]) and not (hops["dev"] & hops["test"])
    assert all(r["hop2"] != r["hop1"] and r["task"] == "math" for rs in rows.values() for r in rs)


def test_world_numbers_distinct_relations_derangements_and_namesakes():
    w = webhop.world()
    towns = [p for p in w if p["kind"] == "town"]
    names = {t["name"] for t in towns}
    assert len(w) == 2 * len(towns) == 2 * webhop.N_TOWNS
    for a, (lo, hi) in webhop.RANGES.items():
        assert len({p[a] for p in w}) == len(w) and all(lo <= p[a] <= hi for p in w)
    for t in towns:
        assert t["twin"] in names and t["rival"] in names and len({t["name"], t["twin"], t["rival"]}) == 3
    assert sorted(t["twin"] for t in towns) == sorted(names)
    for p in w:
        if p["kind"] == "namesake":  # "North Belmor": the same last word, another place
            assert p["name"].split()[-1] == p["of"] and p["of"] in names and p["name"] not in names


def test_page_openings_hold_no_fact():
    """What a snippet shows (the opening, longer than snippet_chars) has no number and no relation,
    and a page is several browse windows long."""
    for row in webhop.pages(webhop.world()):
        opening = row["text"].split("\n")[0]
        assert len(opening) > webhop.WEB["snippet_chars"] and not re.search(r"\d|twin|rival", opening)
        assert len(row["text"]) > 2.5 * webhop.WEB["window_chars"]


def _numbers(text: str) -> set[str]:
    """The numbers a reader sees in tool output: not those of URLs, result ranks or window counters."""
    text = re.sub(r"https?://\S+|\[page \d+ of \d+[^\]]*\]|^\d+\. ", " ", text, flags=re.M)
    return set(re.findall(r"\d+", text))


def _windows(tools, url: str) -> str:
    """The whole page as `browse` shows it, window after window."""
    from arpo.tools.base import ToolCall

    out, k = [], 1
    while True:
        r = tools.run(ToolCall("browse", f"{url} page={k}"))
        assert r.ok, r.output
        out.append(r.output)
        if "for more" not in r.output.split("\n", 3)[2]:
            return "\n".join(out)
        k += 1


def test_every_question_scripted_trajectory_1_first_page_and_snippets_0(tools):
    """All 360 questions through the real tools over HTTP: the scripted trajectory gets reward 1.0;
    every number on the first page (all its windows) and every number in the search results gets 0."""
    from arpo.tools.base import ToolCall

    search = lambda q: tools.run(ToolCall("web_search", q))  # noqa: E731
    browse = lambda q: tools.run(ToolCall("browse", q))  # noqa: E731
    first_pages: dict[str, str] = {}
    n = guesses = 0
    for split in webhop.SPLITS:
        for ex in load_examples(f"webhop:{split}"):
            text, spans, why = webhop_trajectory(ex, search, browse)
            assert why == "ok" and text is not None, (ex["id"], why)
            assert _reward(text, ex, spans) == 1.0, (ex["id"], text)
            # URLs out: the server's random port can hold the gold's digits (127.0.0.1:59365 vs 593)
            results = [re.sub(r"https?://\S+", "", text[s:e]) for s, e in spans]
            snippets = results[0] + results[2]  # the two searches' results
            gold = ex["answers"][0]
            assert gold not in snippets and gold not in results[1]  # neither the snippets nor the first page's passages
            x = webhop.parse_question(ex["question"])[2]
            if x not in first_pages:
                url = webhop.pick_url(search(x), x)
                first_pages[x] = _windows(tools, url)
            numbers = _numbers(first_pages[x] + snippets)
            assert len(numbers) >= 3  # the first page's own population, elevation, founding year
            for g in numbers:
                guess = f"{text[:spans[1][1]]}<answer>\\boxed{{{g}}}</answer>"  # stop after the first page
                assert _reward(guess, ex, spans[:2]) == 0.0, (ex["id"], g)
                guesses += 1
            n += 1
    assert n == 360 and guesses >= 3 * 360  # (a hang: pytest's --timeout=600)


def test_sft_data_command_writes_the_scripted_trajectories(web, tmp_path, capsys):
    from arpo.cli import main
    from arpo.sft.rows import tokenize_row
    from arpo.testing import tiny_tokenizer

    out = tmp_path / "sft.jsonl"
    rc = main(["web", "sft-data", "--data", "webhop:dev[0:6]", "--web-url", web, "--web-top-k", "2",
               "--web-snippet-chars", str(webhop.WEB["snippet_chars"]), "--browse-window-chars",
               str(webhop.WEB["window_chars"]), "--out", str(out), "--quiet"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["written"] == 6
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    dev = load_examples("webhop:dev[0:6]")
    for row, ex in zip(rows, dev, strict=True):
        assert row["system"] == "webhop" and row["answers"] == ex["answers"]
        assert row["response"].count("<web_search>") == 2 and row["response"].count("<browse>") == 2
        assert row["response"].endswith(f"<answer>\\boxed{{{ex['answers'][0]}}}</answer>")
        # before the second search the model writes the first page's line of the asked relation, then
        # searches the town it names (a 135M model copies a line better than it picks one)
        _, rel, x = webhop.parse_question(ex["question"])
        copied = re.findall(r"<think>The (\w+) town of (\w+) is (\w+)\.</think>\n<web_search>(\w+)</web_search>",
                            row["response"])
        assert len(copied) == 1 and copied[0][:2] == (rel, x) and copied[0][2] == copied[0][3]
        first_page = row["response"][row["tool_results"][1][0]:row["tool_results"][1][1]]
        assert f"The {rel} town of {x} is {copied[0][2]}.\n" in first_page
        assert _reward(row["response"], ex, row["tool_results"]) == 1.0
    prompt, ids, mask = tokenize_row(tiny_tokenizer(), rows[0])
    assert 0 < sum(mask) < len(mask) == len(ids) and prompt


def test_parse_question_and_readers():
    assert webhop.parse_question("What is the founding year of the rival town of Belmor?") == \
        ("founding year", "rival", "Belmor")
    with pytest.raises(ValueError):
        webhop.parse_question("How tall is Belmor?")
    page = "The twin town of Belmor is Karvin.\nThe rival town of North Belmor is Drosk."
    assert webhop.read_relation(page, "twin", "Belmor") == "Karvin"
    assert webhop.read_relation(page, "rival", "Belmor") is None  # North Belmor's rival is not Belmor's
    assert webhop.read_attribute("Karvin has a population of 41207.", "population", "Karvin") == "41207"


def test_eval_json_has_the_deep_search_metrics(web, tools, tmp_path, capsys, monkeypatch):
    """`arpo eval --data webhop:dev --template webhop --tools web_search,browse` with the tiny model
    scripted to write the expert's calls: through the real tools it is correct, and its record and the
    dataset's results carry the deep-search metrics (2 searches, 2 pages read, both supporting pages
    opened, the answer on the second page)."""
    from arpo.cli import main
    from arpo.rollout.agent import AgentLoop
    from arpo.testing import scripted_hook
    from arpo.tools.base import ToolCall

    ex = load_examples("webhop:dev[0:1]")[0]
    text, spans, _ = webhop_trajectory(ex, lambda q: tools.run(ToolCall("web_search", q)),
                                            lambda q: tools.run(ToolCall("browse", q)))
    cuts = [0] + [i for sp in spans for i in sp] + [len(text)]
    segments = [text[cuts[i]:cuts[i + 1]] for i in range(0, len(cuts), 2)]
    params = AgentLoop.params

    def scripted(self, prompt_len, seed):
        p = params(self, prompt_len, seed)
        p.logits_hook = scripted_hook(self.tok, segments)
        return p

    monkeypatch.setattr(AgentLoop, "params", scripted)
    out = tmp_path / "e.json"
    assert main(["eval", "--model", "tiny-random", "--data", "webhop:dev[0:1]", "--template", "webhop", "--tools",
                 "web_search,browse", "--web-url", web, "--web-top-k", "2", "--web-snippet-chars", "30",
                 "--browse-window-chars", "120", "--max-response-tokens", "4000", "--json", "--quiet",
                 "--out", str(out)]) == 0
    res = json.loads(capsys.readouterr().out)["results"]["webhop:dev[0:1]"]
    assert res["pass@1"] == 1.0 and res["tool_calls/web_search"] == 2 and res["tool_calls/browse"] == 2
    assert res["deep_search/searches"] == 2 and res["deep_search/pages_read"] == 2
    assert res["deep_search/supporting_opened"] == 1.0 and res["deep_search/answer_on_page"] == 1.0
    rec = json.loads(out.read_text())["records"]["webhop:dev[0:1]"][0]
    ds = rec["deep_search"]
    hop2 = ex["supporting"][1]
    assert ds["supporting"] == ex["supporting"] and ds["supporting_opened"] == 2
    assert ds["answer_page"] == f"{web}/wiki/{hop2}" and ds["pages"][1] == ds["answer_page"]
