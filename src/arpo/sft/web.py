"""Worked deep-search trajectories made through the real web tools (cold-start SFT rows for
`web_search` + `browse`), from multi-hop rows and their supporting pages (HotpotQA's supporting
facts, MuSiQue's paragraphs marked is_supporting and its `question_decomposition`, or a `supporting`
list of titles), hop by hop in the question's order (sft/hops.py):

    <think> I look up The Collegian: owned by. </think>  (or: I need to find information about X.)
    <web_search> The Collegian owned by </web_search>  <- the question's words (a decomposition's sub-question,
                                                          else the question, then the name as written)
    <result> 1. The Collegian / URL: ... </result>     <- answered by the real tool (the local web or the internet)
    <think> I open the page about The Collegian and look for what the question asks. </think>
    <browse> URL | question </browse>                  <- the real page, fetched and extracted
    <result> URL: ... Passages about ... </result>
    ... the next hop (its sub-question with #1 replaced by what the first page said) ...
    <think> From the pages, the answer is A. </think>
    <answer> \\boxed{A} </answer>

A row is dropped (and counted) when no query returns a result titled as the hop's page, when a
decomposition's sub-answer is not on the page read for it, when it has more hops than `max_pages`,
or when the pages read contain neither the gold answer nor one of its `answer_aliases` (yes/no
answers excepted). Rows have the layout of sft/rows.py with system template `deep_search`; their
`answers` hold the answer and its aliases.

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
from arpo.sft.hops import Hop, candidates, plan
from arpo.sft.rows import assemble
from arpo.tools.base import ToolResult, format_result


def _same_title(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def gold_answers(row: dict) -> list[str]:
    """The row's answer and its `answer_aliases` (MuSiQue's), without repeats or empties."""
    al = row.get("answer_aliases")
    out = [str(row.get("answer", "")).strip(), *(str(a).strip() for a in (al if isinstance(al, list) else []))]
    return list(dict.fromkeys(a for a in out if a))


def hop_answers(answer: str, golds: list[str]) -> list[str]:
    """The spellings of a decomposition hop's answer a page may write: the row's answer is also its
    `answer_aliases` (MuSiQue's last sub-answer is the row's answer; its page may write an alias)."""
    norm = normalize_answer(answer)
    return golds if any(normalize_answer(g) == norm for g in golds) else [answer]


def _search_hop(hop: Hop, seen: str, search_tool) -> tuple[str, ToolResult, str] | str:
    """(query, search result, url of the hop's page) for the first candidate query whose results hold
    the page, else the reason it failed."""
    for q in candidates(hop, seen):
        r = search_tool(q)
        if not r.ok:
            return "search failed"
        url = next((u for u, title in zip(r.meta.get("urls", []), r.meta.get("titles", []), strict=True)
                    if _same_title(title, hop.title)), None)
        if url is not None:
            return q, r, url
    return "supporting page not among the search results"


def hotpotqa_to_deep_search(row: dict, search_tool, browse_tool, max_pages: int = 2) -> tuple[dict | None, str]:
    """(row, "ok") or (None, reason). The hops in the question's order with queries from its words
    (sft/hops.py); `search_tool`, `browse_tool`: the registry's web_search and browse tools (their
    results' meta carry the URLs)."""
    golds = gold_answers(row)
    hops = plan(row)
    if not golds or not hops:
        return None, "no answer or no supporting facts"
    if len(hops) > max_pages:
        return None, f"more hops than --max-pages ({len(hops)} > {max_pages})"
    question = row["question"]
    parts, seen = [], question
    found = golds[0].lower() in ("yes", "no")
    for hop in hops:
        got = _search_hop(hop, seen + " " + " ".join(hop.queries), search_tool)
        if isinstance(got, str):
            return None, got
        query, r, url = got
        parts += [(f"<think> {hop.thought} </think>\n<web_search> {query} </web_search>", "model"),
                  (format_result(r.output), "result")]
        page = browse_tool(f"{url} | {question}")
        if not page.ok:
            return None, "browse failed"
        parts += [(f"<think> I open the page about {hop.name} and look for what the question asks. </think>\n"
                   f"<browse> {url} | {question} </browse>", "model"), (format_result(page.output), "result")]
        if hop.answer is not None and not any(normalize_answer(a) in normalize_answer(page.output)
                                              for a in hop_answers(hop.answer, golds)):
            return None, "a hop's answer not in its page read"
        seen += " " + page.output
        found = found or any(normalize_answer(g) in normalize_answer(page.output) for g in golds)
    if not found:
        return None, "answer not in the pages read"
    answer = golds[0]
    parts.append((f"<think> From the pages, the answer is {answer}. </think>\n<answer> \\boxed{{{answer}}} </answer>",
                  "model"))
    response, spans = assemble(parts)
    return {"id": str(row.get("id", "")), "task": "qa", "question": question, "answers": golds,
            "system": "deep_search", "response": response, "tool_results": spans,
            "source": "hotpotqa-supporting-facts(web_search+browse)"}, "ok"


def webhop_trajectory(example: dict, search: Callable, browse: Callable) -> tuple[str | None, list[list[int]], str]:
    """The scripted correct trajectory of `example` through the real tools: (response or None, the
    [start, end) spans of the result blocks, "ok" or why it failed). `search(query)` / `browse(input)`
    return ToolResults (the registry's web_search and browse). The second search's query and the
    answer are read off the pages the tools return, never from the example's fields."""
    a, rel, x = parse_question(example["question"])
    return town_chain_trajectory(x, (rel,), a, search, browse)


def webhop3_trajectory(example: dict, search: Callable, browse: Callable) -> tuple[str | None, list[list[int]], str]:
    """webhop_trajectory over webhop3's three pages: (response or None, result spans, "ok" or why not).
    Search X, browse its page for r1, copy the line "The r1 town of X is Y.", search Y, browse for r2,
    copy "The r2 town of Y is Z.", search Z, browse for the attribute, answer. Every name and the
    answer are read off the pages the tools return, never from the example's fields."""
    a, rels, x = webhop3.parse_question(example["question"])
    return town_chain_trajectory(x, rels, a, search, browse)


def town_chain_trajectory(x: str, relations: tuple[str, ...], attribute: str, search: Callable,
                          browse: Callable) -> tuple[str | None, list[list[int]], str]:
    """The hop loop of webhop's and webhop3's trajectories, one page per hop: search the town, browse its
    page for the next relation (the last page: for `attribute`), copy the line "The r town of X is Y."
    the model follows, search Y, ..., answer with the number read off the last page. (response or None,
    result spans, "ok" or "hop N: why not")."""
    then = "".join(f", then its {r} town" for r in relations[1:])
    pieces: list[tuple[str, bool]] = [(f"<think>The {relations[0]} town of {x}{then}, then its {attribute}.</think>\n",
                                       True)]
    town = x
    for hop, query in enumerate([*(f"{r} town" for r in relations), attribute], 1):
        found = search(town)
        url = pick_url(found, town) if found.ok else None
        pieces += [(f"<web_search>{town}</web_search>", True), (format_result(found.output), False)]
        if url is None:
            return None, [], f"hop {hop}: no search result titled {town}"
        page = browse(f"{url} | {query}")
        pieces += [(f"<browse>{url} | {query}</browse>", True), (format_result(page.output), False)]
        if not page.ok:
            return None, [], f"hop {hop}: browse failed"
        if hop <= len(relations):
            rel = relations[hop - 1]
            nxt = read_relation(page.output, rel, town)
            if nxt is None:
                return None, [], f"hop {hop}: the {rel} town of {town} is not in the passages read"
            # the model copies the line it follows before it searches: "The rival town of X is Y."
            # matches the question's words, so the name comes from the asked line, not the other one
            pieces.append((f"<think>The {rel} town of {town} is {nxt}.</think>\n", True))
            town = nxt
        else:
            value = read_attribute(page.output, attribute, town)
            if value is None:
                return None, [], f"hop {hop}: the {attribute} of {town} is not in the passages read"
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
