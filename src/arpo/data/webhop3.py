"""`webhop3`: three-hop questions answered on the local web with `web_search` and `browse` (issue 59,
Build 4: a web task with room to learn). Built-in dataset `webhop3:train|dev|test`, its pages
`webhop3:pages` (`arpo web serve --corpus webhop3:pages`), prompt template `webhop3`.

webhop (data/webhop.py) left the SFT start right on 0.87-0.95 of its held-out questions: one copied
line was the whole task. Here the question composes two relations, so the first page's line of the
asked relation names a town that is *not* the answer's page:

    "What is the elevation of the rival town of the sister town of Belmor?"
    <web_search>Belmor</web_search>                   -> Belmor, North Belmor, Belmor Ford (any order)
    <browse>URL of Belmor | sister town</browse>      -> the three relation lines of Belmor
    <think>The sister town of Belmor is Karvin.</think>
    <web_search>Karvin</web_search>                   -> Karvin and its two near-namesakes
    <browse>URL of Karvin | rival town</browse>       -> Karvin's three relation lines
    <think>The rival town of Karvin is Drosk.</think>
    <web_search>Drosk</web_search>
    <browse>URL of Drosk | elevation</browse>         -> Drosk's elevation
    <answer>\\boxed{873}</answer>

The wrong turns: the relations are applied inner first (the question names the sister town last);
every page names three related towns (twin, rival, sister: three derangements, pairwise different per
town), and the browse excerpt of one relation shows all three lines; every town has two
near-namesakes (`North Belmor`, `Belmor Ford`: pages of the same shape about other places, whose
relations point at other towns and whose numbers are their own), and a search returns all three.
Every number is distinct per attribute over all 3 * N_TOWNS places in disjoint ranges (webhop's), so
a number read off any page but the third is never the answer; the chain's three towns are distinct.

Splits by the first-hop town (the question's cluster): 80 train towns x 6 questions, 60 dev and 60
test towns x 3 questions (one per attribute); no dev or test question starts from a town a train
question starts from. `python -m arpo.data.webhop3 [OUT_DIR]` regenerates the shipped files byte for
byte (gzip mtime 0); tests/data/test_webhop3.py checks that it does and runs the scripted trajectory
(sft/web.webhop3_trajectory) of every question through a real `arpo web serve`.
"""

from __future__ import annotations

import random
import re
import sys
from typing import Any

from arpo.data.hop2 import SPLITS, derangement, town_names
from arpo.data.webhop import ATTRIBUTES, RANGES, TownWeb

SEED = 59
N_TOWNS = 200
TOWNS = {"train": 80, "dev": 60, "test": 60}  # first-hop towns (clusters) per split
PER_TOWN = {"train": 6, "dev": 3, "test": 3}  # questions per first-hop town
RELATIONS = ("twin", "rival", "sister")
TEMPLATE = "webhop3"
TOOLS = ("web_search", "browse")
PREFIXES = ("North", "South", "Old", "New", "Upper", "Lower")
SUFFIXES = ("Ford", "Heath", "Cross", "Mill", "Green", "Bridge")
# the result sizes the task is made for: the top 3 results (a town and its two near-namesakes) with
# 12-character snippets (the opening is longer: a snippet never reaches a fact), 120-character windows
WEB = {"top_k": 3, "snippet_chars": 12, "window_chars": 120}
# the host its web is reached at: `http://localhost:PORT` is 8 SmolLM2 tokens shorter than
# `http://127.0.0.1:PORT`, and a trajectory writes or reads 15 URLs (arpo web serve listens on 127.0.0.1)
HOST = "localhost"
# filler paragraphs per page (the range drawn from): a town's page is the longer, so BM25 ranks one of
# its near-namesakes above it in about two searches of three (the agent has to read the titles)
FILLERS = {"town": (2, 5), "namesake": (0, 3)}

# one-letter onsets and vowels: short names are few tokens (a name is written 15-20 times a trajectory)
_ONSETS = list("bcdfghklmnprstvz")
_VOWELS = list("aeiou")
_CODAS = ["", "n", "r", "l", "s", "m"]
_VALLEYS = ["Ostvale", "Marren", "Tolby", "Heskin", "Corran", "Ulmet", "Varden", "Pellow"]
_RIVERS = ["Quell", "Amber", "Sedge", "Lorn", "Wend", "Ferrow", "Tarn", "Mossy Brook"]
_FILLERS = [
    "Its old market opens every {day}.", "Farmers there grow {crop}.", "A stone bridge crosses the {river}.",
    "The {crop} fair is held in {month}.", "Most houses are built of {stone}.", "The bell rings on {day}s.",
]
_WORDS = {"day": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"],
          "crop": ["barley", "rye", "oats", "flax", "hops", "turnips", "apples", "plums"],
          "month": ["March", "May", "June", "August", "October"],
          "stone": ["granite", "slate", "limestone", "sandstone"]}


def _fact(attr: str, name: str, value: Any) -> str:
    if attr in RELATIONS:
        return f"The {attr} town of {name} is {value}."
    return {"population": f"{name} has a population of {value}.",
            "elevation": f"The elevation of {name} is {value} metres.",
            "founding year": f"The founding year of {name} is {value}."}[attr]


def _fillers(rng: random.Random, river: str, k: int = 2) -> list[str]:
    return [t.format(day=rng.choice(_WORDS["day"]), crop=rng.choice(_WORDS["crop"]), river=river,
                     month=rng.choice(_WORDS["month"]), stone=rng.choice(_WORDS["stone"]))
            for t in rng.sample(_FILLERS, k)]


def relation_maps(rng: random.Random, names: list[str]) -> dict[str, dict[str, str]]:
    """{relation: name -> name}: three derangements that differ at every town (a town's twin, rival
    and sister are three other towns)."""
    twin = derangement(rng, names)
    rival = derangement(rng, names, avoid=twin)
    while True:
        sister = derangement(rng, names, avoid=twin)
        if all(sister[n] != rival[n] for n in names):
            return {"twin": twin, "rival": rival, "sister": sister}


def make_world(n: int = N_TOWNS, seed: int = SEED) -> list[dict]:
    """3n places {name, kind: town | namesake, of (a namesake's town), twin, rival, sister, population,
    elevation, founding year, paragraphs}: n towns with distinct one-word names, their relations, then
    each town's two near-namesakes (`PREFIX Name`, `Name SUFFIX`) whose relations point at three
    other towns. Numbers are distinct per attribute over all 3n places."""
    rng = random.Random(f"webhop3-world:{seed}")
    names = town_names(rng, n, codas=_CODAS, onsets=_ONSETS, vowels=_VOWELS)
    rel = relation_maps(rng, names)
    values = {a: rng.sample(range(lo, hi + 1), 3 * n) for a, (lo, hi) in RANGES.items()}
    places: list[dict[str, Any]] = [{"name": nm, "kind": "town", "of": None, **{r: rel[r][nm] for r in RELATIONS}}
                                    for nm in names]
    for nm in names:
        others = [x for x in names if x != nm]
        for near in (f"{rng.choice(PREFIXES)} {nm}", f"{nm} {rng.choice(SUFFIXES)}"):
            places.append({"name": near, "kind": "namesake", "of": nm,
                           **dict(zip(RELATIONS, rng.sample(others, len(RELATIONS)), strict=True))})
    for i, p in enumerate(places):
        for a in ATTRIBUTES:
            p[a] = values[a][i]
        river = rng.choice(_RIVERS)
        opening = f"{p['name']} lies in the {rng.choice(_VALLEYS)} valley, on the {river}."
        facts = [_fact(a, p["name"], p[a]) for a in (*RELATIONS, *ATTRIBUTES)]
        body = facts + _fillers(rng, river, rng.randint(*FILLERS[p["kind"]]))
        rng.shuffle(body)
        p["paragraphs"] = [opening, *body]
    return places


def pages(world: list[dict]) -> list[dict]:
    """The corpus rows {id, title, text} of `arpo web serve --corpus` (a paragraph a line)."""
    return [{"id": p["name"], "title": p["name"], "text": "\n".join(p["paragraphs"])} for p in world]


def question_text(attribute: str, r1: str, r2: str, town: str) -> str:
    """The question whose chain is town -r1-> Y -r2-> Z, asking Z's attribute."""
    return f"What is the {attribute} of the {r2} town of the {r1} town of {town}?"


def _chains(towns: dict[str, dict], x: str) -> list[tuple[str, str]]:
    """The (r1, r2) whose chain x -r1-> y -r2-> z has three distinct towns."""
    return [(r1, r2) for r1 in RELATIONS for r2 in RELATIONS if towns[towns[x][r1]][r2] != x]


def make_questions(world: list[dict], seed: int = SEED) -> dict[str, list[dict]]:
    """{split: examples}, split by the first-hop town (TOWNS per split, shuffled with the seed).
    A town's questions: PER_TOWN[split] distinct (r1, r2, attribute), every attribute once per three
    (the relation pairs drawn from those whose chain has three distinct towns). An example: {id,
    question, answers, task: math, hop1, relations: [r1, r2], hop2, hop3, attribute, supporting: [hop1,
    hop2, hop3] (the pages' titles), cluster: hop1, split}; rows shuffled per split."""
    towns = {p["name"]: p for p in world if p["kind"] == "town"}
    order = list(towns)
    random.Random(f"webhop3-split:{seed}").shuffle(order)
    rng = random.Random(f"webhop3-questions:{seed}")
    out: dict[str, list[dict]] = {}
    start = 0
    for split in SPLITS:
        rows = []
        for x in order[start:start + TOWNS[split]]:
            pairs = _chains(towns, x)
            rng.shuffle(pairs)
            for k in range(PER_TOWN[split]):
                r1, r2 = pairs[k % len(pairs)]
                a = ATTRIBUTES[k % len(ATTRIBUTES)]
                y = towns[x][r1]
                z = towns[y][r2]
                rows.append({"question": question_text(a, r1, r2, x), "answers": [str(towns[z][a])], "task": "math",
                             "hop1": x, "relations": [r1, r2], "hop2": y, "hop3": z, "attribute": a,
                             "supporting": [x, y, z], "cluster": x})
        start += TOWNS[split]
        random.Random(f"webhop3-order:{seed}:{split}").shuffle(rows)
        out[split] = [{"id": f"webhop3-{split}-{i}", **r, "split": split} for i, r in enumerate(rows)]
    return out


# ---- questions -----------------------------------------------------------------------------------
_REL = "|".join(RELATIONS)
_QUESTION = re.compile(rf"What is the (population|elevation|founding year) of the ({_REL}) town of the ({_REL}) "
                       rf"town of (\w+)\?")


def parse_question(question: str) -> tuple[str, tuple[str, str], str]:
    """(attribute, (r1, r2) in the order they are followed, first-hop town) of
    "What is the A of the R2 town of the R1 town of X?"."""
    m = _QUESTION.fullmatch(question.strip())
    if m is None:
        raise ValueError(f"not a webhop3 question: {question!r}")
    return m.group(1), (m.group(3), m.group(2)), m.group(4)


def is_webhop3(row: dict) -> bool:
    """Whether a row is a webhop3 question (`arpo web sft-data` writes its scripted trajectory)."""
    try:
        parse_question(str(row.get("question", "")))
    except ValueError:
        return False
    return True


# ---- files ---------------------------------------------------------------------------------------
DATASET = TownWeb("webhop3", SEED, make_world, make_questions, pages)
data_dir, world, files, write = DATASET.data_dir, DATASET.world, DATASET.files, DATASET.write

if __name__ == "__main__":  # python -m arpo.data.webhop3 [OUT_DIR]: regenerate the shipped files
    DATASET.main(sys.argv)
