"""The webhop3 dataset (arpo/data/webhop3.py), checked through a real `arpo web serve --corpus
webhop3:pages` (one server for the file, reached at http://localhost:PORT as the task is) with the real
web_search and browse tools over HTTP: the shipped files match the generator; dev and test have >= 180
questions in >= 60 first-hop clusters, none shared with train; for EVERY question the scripted
three-page trajectory gets reward 1.0, its SmolLM2 length leaves a 1.5x budget's slack, and an answer
made from the first or the second page (any number on it, every window read) or from the search
snippets gets 0; the near-namesakes are real wrong turns (the town's page is often not the first
result); `arpo web sft-data` writes the scripted trajectories."""

from __future__ import annotations

import collections
import json
import re

import pytest

pytest.importorskip("httpx")
pytest.importorskip("trafilatura")

from arpo.data import webhop3
from arpo.data.datasets import load_examples
from arpo.data.webhop import pick_url
from arpo.jsonl import read_jsonl_gz
from arpo.rewards import arpo_reward
from arpo.sft.web import webhop3_trajectory
from arpo.tools.base import ToolCall

BUDGET = 1152  # the response budget the task's trajectories are sized for (docs/data.md, the datasheet)


@pytest.fixture(scope="module")
def web():
    """`arpo web serve --corpus webhop3:pages` as a real process; yields its base URL at webhop3.HOST."""
    from arpo.web.process import served_web

    with served_web("webhop3:pages") as url:
        yield url.replace("127.0.0.1", webhop3.HOST)


@pytest.fixture(scope="module")
def tools(web):
    from arpo.tools import build_tools

    reg = build_tools(list(webhop3.TOOLS), web={"url": web, **webhop3.WEB})
    yield reg
    reg.close()


def _reward(text: str, ex: dict, spans=None) -> float:
    calls = [{"tool": t, "ok": True} for t in re.findall(r"<(web_search|browse)>", text)]
    res = arpo_reward(text, ex, tools=list(webhop3.TOOLS), tool_spans=spans, tool_calls=calls)
    assert res.format_ok, (text, res)
    return res.reward


def _rows() -> dict[str, list[dict]]:
    return {s: read_jsonl_gz(webhop3.data_dir() / f"{s}.jsonl.gz") for s in webhop3.SPLITS}


def test_shipped_files_are_the_generators_output():
    for name, data in webhop3.files().items():
        assert (webhop3.data_dir() / name).read_bytes() == data, f"{name}: rerun python -m arpo.data.webhop3"


def test_splits_sizes_clusters_and_disjoint_first_hops():
    rows = _rows()
    assert all(len(load_examples(f"webhop3:{s}")) == len(rows[s]) for s in webhop3.SPLITS)
    assert {s: len(r) for s, r in rows.items()} == {"train": 480, "dev": 180, "test": 180}
    clusters = {s: collections.Counter(r["cluster"] for r in rs) for s, rs in rows.items()}
    assert {s: len(c) for s, c in clusters.items()} == {"train": 80, "dev": 60, "test": 60}
    assert set(clusters["dev"].values()) == set(clusters["test"].values()) == {3}
    hops = {s: set(c) for s, c in clusters.items()}
    assert not (hops["train"] & hops["dev"]) and not (hops["train"] & hops["test"]) and not (hops["dev"] & hops["test"])
    towns = {p["name"]: p for p in webhop3.world() if p["kind"] == "town"}
    for rs in rows.values():
        for r in rs:
            x, y, z = r["supporting"]
            r1, r2 = r["relations"]
            assert r["cluster"] == r["hop1"] == x and len({x, y, z}) == 3 and r["task"] == "math"
            assert towns[x][r1] == y and towns[y][r2] == z and r["answers"] == [str(towns[z][r["attribute"]])]
            assert webhop3.parse_question(r["question"]) == (r["attribute"], (r1, r2), x)
    for split in ("dev", "test"):  # one question per attribute per first-hop town
        per = collections.defaultdict(set)
        for r in rows[split]:
            per[r["cluster"]].add(r["attribute"])
        assert all(v == set(webhop3.ATTRIBUTES) for v in per.values())
    keys = [(r["cluster"], *r["relations"], r["attribute"]) for rs in rows.values() for r in rs]
    assert len(keys) == len(set(keys))


def test_world_numbers_relations_and_two_namesakes_per_town():
    w = webhop3.world()
    towns = [p for p in w if p["kind"] == "town"]
    names = {t["name"] for t in towns}
    assert len(w) == 3 * len(towns) == 3 * webhop3.N_TOWNS
    for a, (lo, hi) in webhop3.RANGES.items():
        assert len({p[a] for p in w}) == len(w) and all(lo <= p[a] <= hi for p in w)
    for t in towns:
        assert {t[r] for r in webhop3.RELATIONS} <= names and len({t["name"], *(t[r] for r in webhop3.RELATIONS)}) == 4
    for r in webhop3.RELATIONS:
        assert sorted(t[r] for t in towns) == sorted(names)  # a permutation
    near = collections.Counter(p["of"] for p in w if p["kind"] == "namesake")
    assert set(near) == names and set(near.values()) == {2}
    for p in w:
        if p["kind"] == "namesake":  # "North Belmor", "Belmor Ford": the town's name as a word, another place
            assert p["of"] in p["name"].split() and p["name"] not in names
            assert p["of"] not in {p[r] for r in webhop3.RELATIONS}


def test_page_openings_hold_no_fact():
    """What a snippet shows (the opening, longer than snippet_chars) has no number and no relation,
    and a page is several browse windows long."""
    for row in webhop3.pages(webhop3.world()):
        opening = row["text"].split("\n")[0]
        assert len(opening) > webhop3.WEB["snippet_chars"] and not re.search(r"\d|twin|rival|sister", opening)
        assert len(row["text"]) > 2 * webhop3.WEB["window_chars"]


def _numbers(text: str) -> set[str]:
    """The numbers a reader sees in tool output: not those of URLs, result ranks or window counters."""
    text = re.sub(r"https?://\S+|\[page \d+ of \d+[^\]]*\]|^\d+\. ", " ", text, flags=re.M)
    return set(re.findall(r"\d+", text))


def _windows(tools, url: str) -> str:
    """The whole page as `browse` shows it, window after window."""
    out, k = [], 1
    while True:
        r = tools.run(ToolCall("browse", f"{url} page={k}"))
        assert r.ok, r.output
        out.append(r.output)
        if "for more" not in r.output.split("\n", 3)[2]:
            return "\n".join(out)
        k += 1


def _smollm2_tokens():
    from transformers import AutoTokenizer

    from arpo.models import resolve_model_dir

    tok = AutoTokenizer.from_pretrained(resolve_model_dir("smollm2-135m-instruct"))
    return lambda text: len(tok(text)["input_ids"])


def test_every_question_scripted_trajectory_1_pages_before_the_last_and_snippets_0(web, tools):
    """All 840 questions through the real tools over HTTP: the scripted trajectory gets reward 1.0,
    copies two lines and is at most BUDGET / 1.5 SmolLM2 tokens (the tokenizer of the embedded model;
    URLs at port 8090, as examples/deep_search serves it); every number on the first and the second
    page (all their windows) and in the search results gets 0; the gold is in no snippet and in
    neither earlier page's passages; the town's page is not the first search result in a fair share
    of the searches."""
    n_tokens = _smollm2_tokens()
    lengths = []
    search = lambda q: tools.run(ToolCall("web_search", q))  # noqa: E731
    browse = lambda q: tools.run(ToolCall("browse", q))  # noqa: E731
    whole: dict[str, str] = {}

    def page_text(town: str) -> str:
        if town not in whole:
            whole[town] = _windows(tools, pick_url(search(town), town))
        return whole[town]

    n = guesses = 0
    ranks: collections.Counter = collections.Counter()
    for split in webhop3.SPLITS:
        for ex in load_examples(f"webhop3:{split}"):
            text, spans, why = webhop3_trajectory(ex, search, browse)
            assert why == "ok" and text is not None, (ex["id"], why)
            assert _reward(text, ex, spans) == 1.0, (ex["id"], text)
            assert len(re.findall(r"<think>The \w+ town of \w+ is \w+\.</think>", text)) == 2
            lengths.append(n_tokens(text.replace(web, f"http://{webhop3.HOST}:8090")))
            results = [re.sub(r"https?://\S+", "", text[s:e]) for s, e in spans]  # the port may hold the gold's digits
            for hop, town in enumerate(ex["supporting"]):
                titles = re.findall(r"^\d+\. (.+)$", results[2 * hop], re.M)
                ranks[titles.index(town) + 1] += 1
            gold = ex["answers"][0]
            assert all(gold not in results[k] for k in (0, 1, 2, 3, 4))  # snippets, the first two pages' passages
            first, second = ex["supporting"][:2]
            numbers = _numbers(page_text(first) + page_text(second) + results[0] + results[2] + results[4])
            assert len(numbers) >= 6  # the first two pages' own population, elevation, founding year
            for g in numbers:
                guess = f"{text[:spans[3][1]]}<answer>\\boxed{{{g}}}</answer>"  # stop after the second page
                assert _reward(guess, ex, spans[:4]) == 0.0, (ex["id"], g)
                guesses += 1
            n += 1
    assert n == 840 and guesses >= 6 * 840
    assert set(ranks) == {1, 2, 3} and ranks[1] < 0.6 * sum(ranks.values())  # the namesakes come first often
    assert 600 < min(lengths) and max(lengths) <= BUDGET / 1.5, (min(lengths), max(lengths))
    print(f"webhop3 trajectories: {min(lengths)}-{max(lengths)} SmolLM2 tokens (mean {sum(lengths) / n:.0f}); "
          f"rank of the right page in its search: {dict(sorted(ranks.items()))}")


def test_sft_data_command_writes_the_scripted_trajectories(web, tmp_path, capsys):
    from arpo.cli import main
    from arpo.sft.rows import tokenize_row
    from arpo.testing import tiny_tokenizer

    out = tmp_path / "sft.jsonl"
    rc = main(["web", "sft-data", "--data", "webhop3:dev[0:6]", "--web-url", web, "--web-top-k",
               str(webhop3.WEB["top_k"]), "--web-snippet-chars", str(webhop3.WEB["snippet_chars"]),
               "--browse-window-chars", str(webhop3.WEB["window_chars"]), "--out", str(out), "--quiet"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["written"] == 6
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    dev = load_examples("webhop3:dev[0:6]")
    for row, ex in zip(rows, dev, strict=True):
        assert row["system"] == "webhop3" and row["answers"] == ex["answers"]
        assert row["response"].count("<web_search>") == 3 and row["response"].count("<browse>") == 3
        assert row["response"].endswith(f"<answer>\\boxed{{{ex['answers'][0]}}}</answer>")
        # the line of each relation is copied before the search of the town it names
        copied = re.findall(r"<think>The (\w+) town of (\w+) is (\w+)\.</think>\n<web_search>(\w+)</web_search>",
                            row["response"])
        _, rels, _ = webhop3.parse_question(ex["question"])
        x, y, z = ex["supporting"]
        assert [c[:2] for c in copied] == [(rels[0], x), (rels[1], y)]
        assert [c[3] for c in copied] == [c[2] for c in copied] == [y, z]
        assert _reward(row["response"], ex, row["tool_results"]) == 1.0
    prompt, ids, mask = tokenize_row(tiny_tokenizer(), rows[0])
    assert 0 < sum(mask) < len(mask) == len(ids) and prompt


def test_parse_question_and_row_kind():
    assert webhop3.parse_question("What is the founding year of the rival town of the twin town of Belmor?") == \
        ("founding year", ("twin", "rival"), "Belmor")
    for bad in ("What is the elevation of the twin town of Belmor?", "What is the area of the twin town of the "
                "rival town of Belmor?"):
        with pytest.raises(ValueError):
            webhop3.parse_question(bad)
    from arpo.data import webhop

    q3 = {"question": "What is the elevation of the sister town of the twin town of Belmor?"}
    assert webhop3.is_webhop3(q3) and not webhop.is_webhop(q3)
    assert not webhop3.is_webhop3({"question": "What is the elevation of the twin town of Belmor?"})
    from arpo.data.prompts import template_spec
    from arpo.data.sources import builtin_agent

    assert builtin_agent("webhop3:dev[0:3]") == (webhop3.TOOLS, webhop3.TEMPLATE)  # asked as the task is posed
    assert "{tools}" in template_spec(webhop3.TEMPLATE).system


def test_eval_json_has_the_deep_search_metrics(web, tools, tmp_path, capsys, monkeypatch):
    """`arpo eval --data webhop3:dev[0:1]` (the task's tools and template by default) with the tiny model
    scripted to write the expert's calls: through the real tools it is correct, with 3 searches, 3 pages
    read, all three supporting pages opened and the answer on the third."""
    from arpo.cli import main
    from arpo.rollout.agent import AgentLoop
    from arpo.testing import scripted_hook

    ex = load_examples("webhop3:dev[0:1]")[0]
    text, spans, _ = webhop3_trajectory(ex, lambda q: tools.run(ToolCall("web_search", q)),
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
    assert main(["eval", "--model", "tiny-random", "--data", "webhop3:dev[0:1]", "--web-url", web, "--web-top-k",
                 str(webhop3.WEB["top_k"]), "--web-snippet-chars", str(webhop3.WEB["snippet_chars"]),
                 "--browse-window-chars", str(webhop3.WEB["window_chars"]), "--max-tool-calls", "8",
                 # the test server's port is random (up to 5 digits in each of the ~20 URLs the results show, where
                 # the budget was measured at 8090): room for the metrics, which are what this test checks
                 "--max-response-tokens", str(BUDGET + 256), "--json", "--quiet", "--out", str(out)]) == 0
    res = json.loads(capsys.readouterr().out)["results"]["webhop3:dev[0:1]"]
    assert res["pass@1"] == 1.0 and res["tool_calls/web_search"] == 3 and res["tool_calls/browse"] == 3
    assert res["deep_search/searches"] == 3 and res["deep_search/pages_read"] == 3
    assert res["deep_search/supporting_opened"] == 1.0 and res["deep_search/answer_on_page"] == 1.0
    ds = json.loads(out.read_text())["records"]["webhop3:dev[0:1]"][0]["deep_search"]
    assert ds["supporting"] == ex["supporting"] and ds["supporting_opened"] == 3
    assert ds["answer_page"] == f"{web}/wiki/{ex['supporting'][2]}" and ds["pages"][2] == ds["answer_page"]
