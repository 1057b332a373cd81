"""Worked deep-search trajectories made through the real web tools (cold-start SFT data for
`web_search` + `browse`), from HotpotQA rows and their supporting-fact titles:

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
`arpo sft-data` (recipes/sft_data.py) with system template `deep_search`.
"""

from __future__ import annotations

from arpo.tools.base import format_result


def _same_title(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def hotpotqa_to_deep_search(row: dict, search_tool, browse_tool, max_pages: int = 2) -> tuple[dict | None, str]:
    """(row, "ok") or (None, reason). `search_tool`, `browse_tool`: the registry's web_search and
    browse tools (their results' meta carry the URLs)."""
    from arpo.recipes.sft_data import _assemble, hop_thought, supporting_titles
    from arpo.rewards.answer import normalize_answer

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
    response, spans = _assemble(parts)
    return {"id": str(row.get("id", "")), "task": "qa", "question": row["question"], "answers": [answer],
            "system": "deep_search", "response": response, "tool_results": spans,
            "source": "hotpotqa-supporting-facts(web_search+browse)"}, "ok"


def build_deep_search_sft(data: str, out_path: str, web: dict | None = None, limit: int | None = None,
                          max_pages: int = 2, progress: bool = True) -> dict:
    """Convert HotpotQA rows of the data spec `data` until `limit` rows check out; write JSONL
    atomically. Returns {written, read, dropped{reason: n}, out}."""
    from arpo.data.sources import iter_rows
    from arpo.jsonl import write_jsonl
    from arpo.recipes.sft_data import _convert_rows, _stats
    from arpo.tools import build_tools

    tools = build_tools(["web_search", "browse"], web=web)
    try:
        src = [row for _, row in iter_rows(data)]
        rows, reasons = _convert_rows(
            src, lambda r: hotpotqa_to_deep_search(r, tools["web_search"], tools["browse"], max_pages),
            limit, progress, "deep-search trajectories")
    finally:
        tools.close()
    return _stats(rows, reasons, write_jsonl(out_path, rows))
