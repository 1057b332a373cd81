"""`webhop`: two-hop questions answered on the local web with `web_search` and `browse` (issue 40).
Built-in dataset `webhop:train|dev|test`, its pages `webhop:pages` (the corpus of `arpo web serve
--corpus webhop:pages`), prompt template `webhop`.

The world: N_TOWNS fictional towns (made-up names, so no model knows them), each with a twin town
and a rival town (two derangements: never itself, twin != rival) and three numbers, and for each
town a *near-namesake* (`North Belmor`, `Old Belmor`, ...: a page of the same shape about another
place, whose relations point at other towns and whose numbers are its own). Every number is distinct
per attribute over all 2 * N_TOWNS places, and the attributes' ranges are disjoint (population 5
digits, founding year 1100-1899, elevation 3 digits), so a number read off any page but the right one
is never the answer.

A page (`pages.jsonl.gz`, rows {id, title, text}; served as HTML at /wiki/<Title>) opens with a
paragraph without numbers or relations (what a search snippet shows), then its five facts and three
filler paragraphs in a per-page shuffled order, one short paragraph each:

    Belmor lies in the Ostvale valley, on the banks of the Quell.
    The rival town of Belmor is Drosk.
    Belmor has a population of 41207.
    ...

A question asks an attribute of a related town: "What is the elevation of the twin town of Belmor?".
A correct trajectory (the scripted one: sft/web.webhop_trajectory, what `arpo web sft-data`
writes for webhop rows):

    <web_search>Belmor</web_search>               -> the page titled Belmor among its near-namesake, ...
    <browse>URL of Belmor | twin town</browse>    -> the passages about the twin town (and the rival)
    <web_search>Karvin</web_search>               -> the name read off the first page
    <browse>URL of Karvin | elevation</browse>    -> Karvin's elevation
    <answer>\\boxed{873}</answer>

The second search's query is known only after the first page; the snippets never hold a relation or a
number, so `browse` is needed twice; the near-namesake pages and the other relation are the wrong turns.

Splits are by the first-hop town (hop2.TRAIN_TOWNS / DEV_TOWNS / TEST_TOWNS towns, shuffled with the seed),
6 questions each (2 relations x 3 attributes). `python -m arpo.data.webhop [OUT_DIR]` regenerates the
shipped files byte for byte (gzip mtime 0); tests/data/test_webhop.py checks that it does and runs the
scripted trajectory of every question through a real `arpo web serve`.
"""

from __future__ import annotations

import functools
import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the splits (hop2's 40/10/10 first-hop towns), relations and question rows are hop2's
from arpo.data.hop2 import RELATIONS, SPLITS, derangement, town_names, two_hop_questions, write_files
from arpo.data.sources import BUILTIN_DIR
from arpo.jsonl import jsonl_gz_bytes, read_jsonl_gz

SEED = 40
N_TOWNS = 60
ATTRIBUTES = ("population", "elevation", "founding year")
RANGES = {"population": (10000, 99999), "elevation": (100, 999), "founding year": (1100, 1899)}
TEMPLATE = "webhop"
TOOLS = ("web_search", "browse")
PREFIXES = ("North", "South", "Old", "New", "Upper", "Lower")
# the result sizes the task is made for (the example, the tests): the top 2 results with 30-character
# snippets (the opening paragraph is longer: a snippet never reaches a fact), 120-character windows
WEB = {"top_k": 2, "snippet_chars": 30, "window_chars": 120}

_ONSETS = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "st",
           "tr", "sh", "th", "kl", "pr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou", "ei"]
_CODAS = ["", "n", "r", "l", "s", "m", "nd", "rk", "st"]
_VALLEYS = ["Ostvale", "Marren", "Tolby", "Heskin", "Corran", "Ulmet", "Varden", "Pellow"]
_RIVERS = ["Quell", "Amber", "Sedge", "Lorn", "Wend", "Ferrow", "Tarn", "Mossy Brook"]
_FILLERS = [
    "Its old market opens every {day}.", "Farmers there grow {crop} and {crop2}.",
    "A stone bridge crosses the {river} near the square.", "The annual {crop} fair is held in {month}.",
    "Most houses are built of grey {stone}.", "A narrow road climbs to the {stone} quarry.",
    "The chapel bell rings at noon on {day}s.", "Its football club plays in {colour} shirts.",
]
_WORDS = {"day": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"],
          "crop": ["barley", "rye", "oats", "flax", "hops", "turnips", "apples", "plums"],
          "month": ["March", "May", "June", "August", "October"],
          "stone": ["granite", "slate", "limestone", "sandstone"],
          "colour": ["green", "red", "blue", "yellow", "white"]}


def _fact(attr: str, name: str, value: Any) -> str:
    return {"twin": f"The twin town of {name} is {value}.", "rival": f"The rival town of {name} is {value}.",
            "population": f"{name} has a population of {value}.",
            "elevation": f"The elevation of {name} is {value} metres.",
            "founding year": f"The founding year of {name} is {value}."}[attr]


def _filler(rng: random.Random, river: str) -> list[str]:
    out = []
    for tmpl in rng.sample(_FILLERS, 3):
        crops = rng.sample(_WORDS["crop"], 2)
        out.append(tmpl.format(day=rng.choice(_WORDS["day"]), crop=crops[0], crop2=crops[1], river=river,
                               month=rng.choice(_WORDS["month"]), stone=rng.choice(_WORDS["stone"]),
                               colour=rng.choice(_WORDS["colour"])))
    return out


def make_world(n: int = N_TOWNS, seed: int = SEED) -> list[dict]:
    """2n places {name, kind: town | namesake, of (a namesake's town), twin, rival, population,
    elevation, founding year, paragraphs}: n towns with distinct names (4-10 letters), twin and rival
    derangements (twin != rival), then each town's namesake (`PREFIX Name`) whose relations point at
    other towns. Numbers are distinct per attribute over all 2n places."""
    rng = random.Random(f"webhop-world:{seed}")
    names = town_names(rng, n, codas=_CODAS, onsets=_ONSETS, vowels=_VOWELS)
    twin = derangement(rng, names)
    rival = derangement(rng, names, avoid=twin)
    values = {a: rng.sample(range(lo, hi + 1), 2 * n) for a, (lo, hi) in RANGES.items()}
    places: list[dict[str, Any]] = []
    for nm in names:
        places.append({"name": nm, "kind": "town", "of": None, "twin": twin[nm], "rival": rival[nm]})
    for nm in names:
        others = [x for x in names if x != nm]
        t, r = rng.sample(others, 2)
        places.append({"name": f"{rng.choice(PREFIXES)} {nm}", "kind": "namesake", "of": nm, "twin": t, "rival": r})
    for i, p in enumerate(places):
        for a in ATTRIBUTES:
            p[a] = values[a][i]
        river = rng.choice(_RIVERS)
        opening = f"{p['name']} lies in the {rng.choice(_VALLEYS)} valley, on the banks of the {river}."
        body = [_fact(a, p["name"], p[a]) for a in (*RELATIONS, *ATTRIBUTES)] + _filler(rng, river)
        rng.shuffle(body)
        p["paragraphs"] = [opening, *body]
    return places


def pages(world: list[dict]) -> list[dict]:
    """The corpus rows {id, title, text} of `arpo web serve --corpus` (a paragraph a line)."""
    return [{"id": p["name"], "title": p["name"], "text": "\n".join(p["paragraphs"])} for p in world]


def make_questions(world: list[dict], seed: int = SEED) -> dict[str, list[dict]]:
    """{split: examples}: every (town, relation, attribute) question, split by the first-hop town.
    An example: {id, question, answers, task: math, hop1, relation, hop2, attribute, supporting: [hop1,
    hop2] (the pages' titles), split}."""
    towns = [p for p in world if p["kind"] == "town"]
    return two_hop_questions(towns, "webhop", seed, ATTRIBUTES, lambda x, rel, y: {"supporting": [x, y["name"]]})


# ---- questions and the scripted trajectory --------------------------------------------------------
_QUESTION = re.compile(r"What is the (population|elevation|founding year) of the (twin|rival) town of (\w+)\?")


def parse_question(question: str) -> tuple[str, str, str]:
    """(attribute, relation, first-hop town) of "What is the A of the R town of X?"."""
    m = _QUESTION.fullmatch(question.strip())
    if m is None:
        raise ValueError(f"not a webhop question: {question!r}")
    return m.group(1), m.group(2), m.group(3)


def is_webhop(row: dict) -> bool:
    """Whether a row is a webhop question (`arpo web sft-data` writes its scripted trajectory)."""
    try:
        parse_question(str(row.get("question", "")))
    except ValueError:
        return False
    return True


def read_relation(page: str, relation: str, town: str) -> str | None:
    """The town a page's text names as `town`'s `relation` ("The twin town of X is Y."), or None."""
    m = re.search(rf"The {relation} town of {re.escape(town)} is (\w+)\.", page)
    return m.group(1) if m else None


def read_attribute(page: str, attribute: str, town: str) -> str | None:
    """The number a page's text gives as `town`'s `attribute`, or None."""
    pat = {"population": rf"{re.escape(town)} has a population of (\d+)\.",
           "elevation": rf"The elevation of {re.escape(town)} is (\d+) metres\.",
           "founding year": rf"The founding year of {re.escape(town)} is (\d+)\."}[attribute]
    m = re.search(pat, page)
    return m.group(1) if m else None


def pick_url(result, title: str) -> str | None:
    """The URL of the search result titled exactly `title` (a web_search ToolResult's meta), or None."""
    meta = getattr(result, "meta", None) or {}
    return next((u for u, t in zip(meta.get("urls", []), meta.get("titles", []), strict=True) if t == title), None)


# ---- files ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _read_world(path: Path) -> list[dict]:
    return read_jsonl_gz(path)


@dataclass(frozen=True)
class TownWeb:
    """A generated web of towns (webhop here, data/webhop3.py): its folder under data/builtin/, its seed and
    generators, and the files it ships (world.jsonl.gz, pages.jsonl.gz, one file per split), made or read."""

    name: str
    seed: int
    make_world: Callable[..., list[dict]]  # (seed=) -> every place's facts
    make_questions: Callable[[list[dict], int], dict[str, list[dict]]]  # (world, seed) -> split -> rows
    pages: Callable[[list[dict]], list[dict]]  # world -> rows {id, title, text}

    def data_dir(self) -> Path:
        return BUILTIN_DIR / self.name

    def world(self) -> list[dict]:
        """The shipped world (world.jsonl.gz): every place's facts."""
        return _read_world(self.data_dir() / "world.jsonl.gz")

    def files(self, seed: int | None = None) -> dict[str, bytes]:
        """The dataset's files (name -> bytes): world.jsonl.gz, pages.jsonl.gz and one file per split."""
        seed = self.seed if seed is None else seed
        w = self.make_world(seed=seed)
        qs = self.make_questions(w, seed)
        return {"world.jsonl.gz": jsonl_gz_bytes(w), "pages.jsonl.gz": jsonl_gz_bytes(self.pages(w)),
                **{f"{s}.jsonl.gz": jsonl_gz_bytes(qs[s]) for s in SPLITS}}

    def write(self, out_dir: str | Path, seed: int | None = None) -> list[Path]:
        return write_files(self.files(seed), out_dir)

    def main(self, argv: list[str]) -> None:
        """python -m arpo.data.NAME [OUT_DIR]: regenerate the shipped files (into OUT_DIR)."""
        for p in self.write(argv[1] if len(argv) > 1 else self.data_dir()):
            print(p)


DATASET = TownWeb("webhop", SEED, make_world, make_questions, pages)
data_dir, world, files, write = DATASET.data_dir, DATASET.world, DATASET.files, DATASET.write

if __name__ == "__main__":  # python -m arpo.data.webhop [OUT_DIR]: regenerate the shipped files
    DATASET.main(sys.argv)
