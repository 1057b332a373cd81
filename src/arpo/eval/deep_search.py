"""Deep-search metrics of one trajectory: how it searched and what it read (issue 40).

    stats = trajectory_stats(calls, answer, supporting=["Belmor", "Karvin"])
    -> {"searches": 2, "pages_read": 2, "pages": [URL, URL], "supporting": [...], "supporting_opened": 2,
        "all_supporting_opened": True, "answered": True, "answer_page": URL | None}

`calls`: the trajectory's tool calls as dicts {tool, input, output, ok} (eval records, rollout logs).
A search is a `web_search` (or `search`) call; a page read is a successful `browse` call, counted
once per distinct URL (the final URL the tool reports on its `URL:` line). A supporting page (a title
of the example's `supporting` list: webhop's two hops, HotpotQA's supporting facts) counts as opened
when a page read has that title (its `Title:` line, or its URL path's last part with `_` as spaces).
The answer's page is the last page read whose shown text contains the model's answer (both
normalized as the reward does); None when no page read shows it.
"""

from __future__ import annotations

import re
from statistics import fmean
from urllib.parse import unquote, urlsplit

from arpo.rewards.answer import normalize_answer

SEARCH_TOOLS = ("web_search", "search")
WEB_TOOLS = ("web_search", "browse")


def _norm(s: str) -> str:
    return " ".join(s.replace("_", " ").casefold().split())


def page_of(call: dict) -> tuple[str, str] | None:
    """(URL, title) of a successful browse call, from its result's `URL:` / `Title:` lines (the URL
    of the input when the result has none); None for other calls."""
    if call.get("tool") != "browse" or not call.get("ok"):
        return None
    out = str(call.get("output") or "")
    m = re.search(r"^URL: (\S+)", out, re.M)
    given = str(call.get("input") or "").split("|", 1)[0].split()
    if m is None and not given:
        return None
    u = m.group(1) if m else given[0]
    title = re.search(r"^Title: (.+)$", out, re.M)
    t = title.group(1).strip() if title else unquote(urlsplit(u).path.rstrip("/").rsplit("/", 1)[-1])
    return u, t


def trajectory_stats(calls: list[dict], answer: str | None, supporting: list[str] | None = None) -> dict:
    """The deep-search metrics of one trajectory (module docstring)."""
    searches = sum(c.get("tool") in SEARCH_TOOLS for c in calls)
    pages: dict[str, str] = {}
    answer_page = None
    want = normalize_answer(answer) if answer else ""
    for c in calls:
        p = page_of(c)
        if p is None:
            continue
        url, title = p
        pages.setdefault(url, title)
        if want and want in normalize_answer(str(c.get("output") or "")):
            answer_page = url
    sup = [str(s) for s in (supporting or [])]
    seen = {_norm(t) for t in pages.values()} | {_norm(unquote(urlsplit(u).path.rsplit("/", 1)[-1])) for u in pages}
    opened = sum(_norm(s) in seen for s in sup)
    return {"searches": searches, "pages_read": len(pages), "pages": list(pages), "supporting": sup,
            "supporting_opened": opened, "all_supporting_opened": bool(sup) and opened == len(sup),
            "answered": bool(answer), "answer_page": answer_page}


def summarize(stats: list[dict]) -> dict:
    """Means over records: searches, pages read, the share that opened every supporting page (of those
    with supporting pages) and the share whose answer is on a page read (of those that answered)."""
    if not stats:
        return {}
    out = {"searches": fmean(s["searches"] for s in stats), "pages_read": fmean(s["pages_read"] for s in stats)}
    with_sup = [s for s in stats if s["supporting"]]
    if with_sup:
        out["supporting_opened"] = fmean(s["all_supporting_opened"] for s in with_sup)
    answered = [s for s in stats if s["answered"]]
    if answered:
        out["answer_on_page"] = fmean(s["answer_page"] is not None for s in answered)
    return out
