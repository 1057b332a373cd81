"""Worked deep-search trajectories made through the real web tools (cold-start SFT rows for
`web_search` + `browse`), from multi-hop rows and their supporting pages' titles (HotpotQA's
supporting facts, MuSiQue's paragraphs marked is_supporting, or a `supporting` list of titles):

    <think> I need to find information about T1. </think>
    <web_search> T1 </web_search>            <- answered by the real tool (the local web or the internet)
    <result> 1. T1 / URL: ... </result>
    <think> I open the page about T1 and look for what the question asks. </think>
    <browse> URL-of-T1 | question </browse>  <- the real page, fetched and extracted
    <result> URL: ... Passages about ... </result>
    ... the same for T2 ...
    <think> From the pages, the answer is A. </think>
    <answer> \\boxed{A} </answer>

A row is dropped (and counted) when the search does not return a result titled T, or when the
pages read do not contain the gold answer (yes/no answers excepted). Rows have the layout of
sft/rows.py with system template `deep_search`.

Rows of the built-in `webhop` task (data/webhop.py: "What is the A of the R town of X?") get that
task's scripted trajectory instead (`webhop_trajectory`: search X, browse its page for the
relation, write the page's line of the asked relation in <think>, search the town it names, browse
its page for A, answer), with system template `webhop`;
a row is dropped when a page or a fact is not found where the trajectory reads it. Rows of `webhop3`
(data/webhop3.py: "What is the A of the R2 town of the R1 town of X?") get `webhop3_trajectory`: the
same steps over three pages, a copied line before the second and the third search, template `webhop3`.
The recipe that writes them: recipes/web_sft_data.py (`arpo web sft-data`).
"""

from __future__ import annotations

from collections.abc import Callable

from arpo.data import webhop, webhop3
from arpo.data.webhop import parse_question, pick_url, read_attribute, read_relation
from arpo.rewards.answer import normalize_answer
from arpo.sft.convert import hop_thought, supporting_titles
from arpo.sft.rows import assemble
from arpo.tools.base import format_result


def _same_title(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def hotpotqa_to_deep_search(row: dict, search_tool, browse_tool, max_pages: int = 2) -> tuple[dict | None, str]:
    """(row, "ok") or (None, reason). `search_tool`, `browse_tool`: the registry's web_search and
    browse tools (their results' meta carry the URLs)."""
    answer = str(row.get("answer", "")).strip()
    titles = supporting_titles(row, max_pages)
    if not answer or not titles:
        return None, "no answer or no supporting facts"
    parts, found = [], answer.lower() in ("yes", "no")
    for k, t in enumerate(titles):
        r = search_tool(t)
        if not r.ok:
            return None, "search failed"
        url = next((u for u, title in zip(r.meta.get("urls", []), r.meta.get("titles", []), strict=True)
                    if _same_title(title, t)), None)
        if url is None:
            return None, "supporting page not among the search results"
        parts += [(f"{hop_thought(k, t)}<web_search> {t} </web_search>", "model"), (format_result(r.output), "result")]
        page = browse_tool(f"{url} | {row['question']}")
        if not page.ok:
            return None, "browse failed"
        parts += [(f"<think> I open the page about {t} and look for what the question asks. </think>\n"
                   f"<browse> {url} | {row['question']} </browse>", "model"), (format_result(page.output), "result")]
        found = found or normalize_answer(answer) in normalize_answer(page.output)
    if not found:
        return None, "answer not in the pages read"
    parts.append((f"<think> From the pages, the answer is {answer}. </think>\n<answer> \\boxed{{{answer}}} </answer>",
                  "model"))
    response, spans = assemble(parts)
    return {"id": str(row.get("id", "")), "task": "qa", "question": row["question"], "answers": [answer],
            "system": "deep_search", "response": response, "tool_results": spans,
            "source": "hotpotqa-supporting-facts(web_search+browse)"}, "ok"


def webhop_trajectory(example: dict, search: Callable, browse: Callable) -> tuple[str | None, list[list[int]], str]:
    """The scripted correct trajectory of `example` through the real tools: (response or None, the
    [start, end) spans of the result blocks, "ok" or why it failed). `search(query)` / `browse(input)`
    return ToolResults (the registry's web_search and browse). The second search's query and the
    answer are read off the pages the tools return, never from the example's fields."""
    a, rel, x = parse_question(example["question"])
    pieces: list[tuple[str, bool]] = [(f"<think>The {rel} town of {x}, then its {a}.</think>\n", True)]
    town, query = x, f"{rel} town"
    value = None
    for hop in (1, 2):
        found = search(town)
        url = pick_url(found, town) if found.ok else None
        pieces += [(f"<web_search>{town}</web_search>", True), (format_result(found.output), False)]
        if url is None:
            return None, [], f"hop {hop}: no search result titled {town}"
        page = browse(f"{url} | {query}")
        pieces += [(f"<browse>{url} | {query}</browse>", True), (format_result(page.output), False)]
        if not page.ok:
            return None, [], f"hop {hop}: browse failed"
        if hop == 1:
            nxt = read_relation(page.output, rel, x)
            if nxt is None:
                return None, [], f"hop 1: the {rel} town of {x} is not in the passages read"
            # the model copies the line it follows before it searches: "The rival town of X is Y."
            # matches the question's words, so the name comes from the asked line, not the other one
            pieces.append((f"<think>The {rel} town of {x} is {nxt}.</think>\n", True))
            town, query = nxt, a
        else:
            value = read_attribute(page.output, a, town)
            if value is None:
                return None, [], f"hop 2: the {a} of {town} is not in the passages read"
    pieces.append((f"<answer>\\boxed{{{value}}}</answer>", True))
    text, spans = assemble([(piece, "model" if generated else "result") for piece, generated in pieces])
    return text, spans, "ok"


def webhop3_trajectory(example: dict, search: Callable, browse: Callable) -> tuple[str | None, list[list[int]], str]:
    """webhop_trajectory over webhop3's three pages: (response or None, result spans, "ok" or why not).
    Search X, browse its page for r1, copy the line "The r1 town of X is Y.", search Y, browse for r2,
    copy "The r2 town of Y is Z.", search Z, browse for the attribute, answer. Every name and the
    answer are read off the pages the tools return, never from the example's fields."""
    a, rels, x = webhop3.parse_question(example["question"])
    pieces: list[tuple[str, bool]] = [(f"<think>The {rels[0]} town of {x}, then its {rels[1]} town, "
                                       f"then its {a}.</think>\n", True)]
    town = x
    for hop, query in enumerate([f"{rels[0]} town", f"{rels[1]} town", a], 1):
        found = search(town)
        url = pick_url(found, town) if found.ok else None
        pieces += [(f"<web_search>{town}</web_search>", True), (format_result(found.output), False)]
        if url is None:
            return None, [], f"hop {hop}: no search result titled {town}"
        page = browse(f"{url} | {query}")
        pieces += [(f"<browse>{url} | {query}</browse>", True), (format_result(page.output), False)]
        if not page.ok:
            return None, [], f"hop {hop}: browse failed"
        if hop < 3:
            nxt = read_relation(page.output, rels[hop - 1], town)
            if nxt is None:
                return None, [], f"hop {hop}: the {rels[hop - 1]} town of {town} is not in the passages read"
            pieces.append((f"<think>The {rels[hop - 1]} town of {town} is {nxt}.</think>\n", True))
            town = nxt
        else:
            value = read_attribute(page.output, a, town)
            if value is None:
                return None, [], f"hop 3: the {a} of {town} is not in the passages read"
            pieces.append((f"<answer>\\boxed{{{value}}}</answer>", True))
    text, spans = assemble([(piece, "model" if generated else "result") for piece, generated in pieces])
    return text, spans, "ok"


def webhop_to_deep_search(row: dict, search_tool, browse_tool) -> tuple[dict | None, str]:
    """(row, "ok") or (None, reason) for a webhop or webhop3 question: its scripted trajectory."""
    task = webhop3 if webhop3.is_webhop3(row) else webhop
    make = webhop3_trajectory if task is webhop3 else webhop_trajectory
    text, spans, why = make(row, search_tool, browse_tool)
    if text is None:
        return None, why
    golds = [str(a) for a in row.get("answers", [])]
    if not any(f"\\boxed{{{g}}}" in text for g in golds):
        return None, "the pages read gave another answer"
    return {"id": str(row.get("id", "")), "task": "math", "question": row["question"], "answers": golds,
            "system": task.TEMPLATE, "response": text, "tool_results": spans,
            "source": f"{task.TEMPLATE}(web_search+browse)"}, "ok"


def to_deep_search(row: dict, search_tool, browse_tool, max_pages: int = 2) -> tuple[dict | None, str]:
    """A webhop or webhop3 question's scripted trajectory, else a HotpotQA row's (by its supporting facts)."""
    if webhop.is_webhop(row) or webhop3.is_webhop3(row):
        return webhop_to_deep_search(row, search_tool, browse_tool)
    return hotpotqa_to_deep_search(row, search_tool, browse_tool, max_pages)
