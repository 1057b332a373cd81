"""A small MuSiQue-shaped question file of made-up facts, for trying docs/own_corpus.md without a
download: `python examples/deep_search/musique_shaped.py --rows 20 --out my_musique.jsonl`.

Each row is MuSiQue's: `id, question, answer, answer_aliases, paragraphs: [{idx, title,
paragraph_text, is_supporting}], question_decomposition: [{id, question, answer,
paragraph_support_idx}]`, a two-hop question whose first hop names the page of the second. As in
MuSiQue, a page's paragraphs are sections of one article: several paragraphs share a title (the
supporting one often not the first), and a row carries, besides its two supporting paragraphs, other
paragraphs of the same pages and of other rows' pages (so a paragraph repeats across rows). Some
rows have `answer_aliases` that the page writes instead of the answer. Seeded: the same arguments
write the same file.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SYL = ["ka", "lo", "mir", "ven", "tor", "qui", "sal", "dre", "bo", "nix", "pel", "ru", "zan", "fe", "gor", "li"]
KINDS = ["phone", "tractor", "kettle", "camera", "bicycle", "lamp", "radio", "drone"]
GENRES = ["novel", "play", "poem cycle", "memoir"]


def _name(rng: random.Random, parts: int = 2, used: set[str] | None = None) -> str:
    """A made-up name; one not in `used` (then added to it) when given: titles never collide."""
    while True:
        name = "".join(rng.choice(SYL) for _ in range(parts)).capitalize()
        if used is None or name not in used:
            if used is not None:
                used.add(name)
            return name


def _person(rng: random.Random, used: set[str]) -> tuple[str, str]:
    """(full name, the initial-and-surname alias a page may write)."""
    first, last = _name(rng), _name(rng, 3, used)
    return f"{first} {last}", f"{first[0]}. {last}"


def _facts(rng: random.Random, i: int, used: set[str]) -> dict:
    """One question's facts: two pages, each of two or three sections, and the decomposition."""
    city, city2 = _name(rng, 3, used), _name(rng, 3, used)
    year = rng.randint(1890, 2015)
    person, alias = _person(rng, used)
    alias_on_page = i % 3 == 0  # the page writes the alias only: a match only through answer_aliases
    if i % 2 == 0:  # a product, its maker, the maker's founder
        kind = rng.choice(KINDS)
        product, company = f"{_name(rng, 2, used)} {kind}", f"{_name(rng, 2, used)}corp"
        p1 = [(f"The {product} is a {kind} made by {company}.", True),
              (f"The {product} sold well in {city} in {year}.", False)]
        p2 = [(f"{company} makes kettles and lamps in {city2}.", False),
              (f"{company} was founded by {alias if alias_on_page else person} in {year}.", True),
              (f"{company} moved its works to {city} later.", False)]
        return {"question": f"Who founded the company that makes the {product}?", "answer": person,
                "aliases": [alias] if alias_on_page else [], "pages": [(product, p1), (company, p2)],
                "steps": [(f"{product} >> manufacturer", company), ("Who founded #1?", person)]}
    genre = rng.choice(GENRES)  # a work, its author, the author's birthplace
    work = f"{_name(rng, 2, used)} {_name(rng)}"
    p1 = [(f"{work} is a {genre} first printed in {year}.", False),
          (f"{work} was written by {person}.", True)]
    p2 = [(f"{person} was born in {city}.", True),
          (f"{person} taught in {city2} for many years.", False)]
    return {"question": f"In which city was the author of {work} born?", "answer": city, "aliases": [],
            "pages": [(work, p1), (person, p2)], "steps": [(f"{work} >> author", person), ("Where was #1 born?", city)]}


def make_rows(n: int = 20, seed: int = 0, distractors: int = 3) -> list[dict]:
    """n MuSiQue-shaped rows; each carries its own two pages' paragraphs (every section) and every
    section of `distractors` other rows' first pages."""
    rng = random.Random(seed)
    used: set[str] = set()
    facts = [_facts(rng, i, used) for i in range(n)]
    rows = []
    for i, f in enumerate(facts):
        paras: list[dict] = []
        for title, sections in f["pages"]:
            paras += [{"title": title, "paragraph_text": text, "is_supporting": sup} for text, sup in sections]
        others = rng.sample([j for j in range(n) if j != i], min(distractors, n - 1))
        for j in others:
            title, sections = facts[j]["pages"][0]
            paras += [{"title": title, "paragraph_text": text, "is_supporting": False} for text, _ in sections]
        rng.shuffle(paras)
        for k, p in enumerate(paras):
            p["idx"] = k
        support = [next(p["idx"] for p in paras if p["title"] == title and p["is_supporting"])
                   for title, _ in f["pages"]]
        steps = [{"id": k + 1, "question": q, "answer": a, "paragraph_support_idx": s}
                 for k, ((q, a), s) in enumerate(zip(f["steps"], support, strict=True))]
        rows.append({"id": f"mq{i:03d}", "question": f["question"], "answer": f["answer"],
                     "answer_aliases": f["aliases"],
                     "paragraphs": [{"idx": p["idx"], "title": p["title"], "paragraph_text": p["paragraph_text"],
                                     "is_supporting": p["is_supporting"]} for p in paras],
                     "question_decomposition": steps, "answerable": True})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="my_musique.jsonl")
    a = ap.parse_args(argv)
    rows = make_rows(a.rows, a.seed)
    Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    paras = {(p["title"], p["paragraph_text"]) for r in rows for p in r["paragraphs"]}
    print(f"{a.out}: {len(rows)} rows, {len(paras)} distinct paragraphs on {len({t for t, _ in paras})} titles")


if __name__ == "__main__":
    main()
