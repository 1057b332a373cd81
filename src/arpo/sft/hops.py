"""The hops of a worked deep-search trajectory, in the question's order, with the queries a searcher
could write (sft/web.py runs them through the real tools).

* MuSiQue's `question_decomposition` (`[{question, answer, paragraph_support_idx}, ...]`) is the order:
  hop k reads the paragraph `paragraph_support_idx` and searches its sub-question, `#j` replaced by
  hop j's answer (which the trajectory has just read on hop j's page) and MuSiQue's `X >> relation`
  written `X relation`: "The Collegian >> owned by", "When was #1 founded?" -> "The Collegian owned
  by", "When was Houston Baptist University founded?".
* Otherwise (HotpotQA's supporting facts, MuSiQue without a decomposition, a `supporting` list) the
  pages the question names come first, in the order it names them ("Ed Wood (film)" is named by "Ed
  Wood"), then the others in the row's order (a bridge: its name is read on an earlier page). The
  first hop searches the question itself; a later one the name as the question writes it, or as the
  pages read so far write it.

A hop's queries are candidates, tried in order until one returns the page; the page's name is a
candidate only where a searcher has seen it (the question, the sub-question or a page read), never
a title that nothing has named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from arpo.data.datasets import supporting_titles
from arpo.rewards.answer import normalize_answer


@dataclass
class Hop:
    title: str  # the page this hop must find and read
    thought: str  # the <think> before its search
    queries: list[str] = field(default_factory=list)  # candidates a searcher could write, in order
    name: str = ""  # the page's name as a searcher writes it (its title without "(film)"); searched if seen
    answer: str | None = None  # the sub-answer this page gives (a decomposition's), checked on the page read


def short_name(title: str) -> str:
    """"Ed Wood (film)" -> "Ed Wood": the name a question or a page writes."""
    return re.sub(r"\s*\([^()]*\)\s*$", "", title).strip() or title


def mentions(text: str, name: str) -> bool:
    """`text` writes `name` (SQuAD-normalized words, whole words)."""
    n = normalize_answer(name)
    return bool(n) and f" {n} " in f" {normalize_answer(text)} "


def _position(question: str, title: str) -> int | None:
    q = normalize_answer(question)
    n = normalize_answer(short_name(title))
    i = f" {q} ".find(f" {n} ") if n else -1
    return None if i < 0 else i


def decomposition_hops(row: dict) -> list[Hop] | None:
    """The hops of a MuSiQue row's `question_decomposition`, or None when it has none usable."""
    steps, paras = row.get("question_decomposition"), row.get("paragraphs")
    if not (isinstance(steps, list) and steps and isinstance(paras, list)):
        return None
    hops: list[Hop] = []
    answers: list[str] = []
    for step in steps:
        if not isinstance(step, dict):
            return None
        q, a, idx = step.get("question"), step.get("answer"), step.get("paragraph_support_idx")
        if not (isinstance(q, str) and isinstance(a, str) and isinstance(idx, int) and 0 <= idx < len(paras)
                and isinstance(paras[idx], dict) and isinstance(paras[idx].get("title"), str)):
            return None
        q = re.sub(r"#(\d+)", lambda m: answers[int(m.group(1)) - 1] if 0 < int(m.group(1)) <= len(answers)
                   else m.group(0), q)
        answers.append(a)
        if " >> " in q:  # "Green >> performer": the performer of Green
            subject, relation = (x.strip() for x in q.split(" >> ", 1))
            thought, query = f"I look up {subject}: {relation}.", f"{subject} {relation}"
        else:
            thought, query = f"I need to find out: {q}", q
        title = paras[idx]["title"]
        if hops and hops[-1].title == title:  # two steps answered by one page: one search, one read
            hops[-1].answer, hops[-1].thought = a, hops[-1].thought + " " + thought
            continue
        hops.append(Hop(title, thought, [query], short_name(title), a))
    return hops


def question_order_hops(row: dict, question: str) -> list[Hop]:
    """The supporting pages, those the question names first (in its order), then the others."""
    titles = supporting_titles(row)
    pos = {t: _position(question, t) for t in titles}
    named = sorted((t for t in titles if pos[t] is not None), key=lambda t: pos[t] or 0)
    order = named + [t for t in titles if pos[t] is None]
    hops = []
    for k, t in enumerate(order):
        name = short_name(t)
        thought = f"I need to find information about {name}." if k == 0 else f"Next I need {name}."
        hops.append(Hop(t, thought, [question] if k == 0 else [], name))
    return hops


def plan(row: dict) -> list[Hop]:
    """The row's hops in the question's order (a decomposition's where given)."""
    return decomposition_hops(row) or question_order_hops(row, str(row.get("question", "")))


def candidates(hop: Hop, seen: str) -> list[str]:
    """The queries to try for `hop`: its own, then its page's name where `seen` (the question and the
    pages read so far) writes it."""
    out = list(hop.queries)
    if mentions(seen, hop.name) and hop.name not in out:
        out.append(hop.name)
    return out
