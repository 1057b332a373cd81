"""`hop2`: two-hop questions over a small fictional knowledge base, where the second lookup depends on
what the first returned (issue 32, Build 1). Built-in dataset `hop2:train|dev|test`, tool
`arpo.data.hop2:lookup`, prompt template `hop2`.

The world: N_TOWNS fictional towns (made-up names, so no model knows them), each with a twin town and
a rival town (two derangements: never itself, twin != rival) and three numbers, distinct per
attribute across towns and in disjoint ranges (population 4 digits, elevation 3, area 2). `lookup`
returns one town's page, facts in a fixed per-town shuffled order:

    <lookup>Belmor</lookup>  ->  Belmor: rival town Drosk. area 55. twin town Karvin. population 4120. elevation 873.

A question asks an attribute of a related town: "What is the area of the twin town of Belmor?". A
correct trajectory looks up Belmor, reads the twin's name (Karvin) off the result, looks up Karvin
and answers its area; the second call's argument is known only after the first result, and the
first page also names the rival town (the wrong branch). With distinct values per attribute and
disjoint ranges, an answer made from the first page alone is never right (reward 0).

Splits are by the first-hop town (TRAIN_TOWNS / DEV_TOWNS / TEST_TOWNS towns, shuffled with the
seed), 6 questions each (2 relations x 3 attributes): no dev or test question starts from a town a
training question starts from. `python -m arpo.data.hop2 [OUT_DIR]` regenerates the shipped files
byte for byte (gzip mtime 0); tests/data/test_hop2.py checks that it does. The scripted correct
trajectory is sft/convert.hop2_response (`arpo sft-data hop2`).
"""

from __future__ import annotations

import functools
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path

from arpo.data.sources import BUILTIN_DIR
from arpo.jsonl import jsonl_gz_bytes, read_jsonl_gz

SEED = 32
N_TOWNS = 60
TRAIN_TOWNS, DEV_TOWNS, TEST_TOWNS = 40, 10, 10
RELATIONS = ("twin", "rival")
ATTRIBUTES = ("population", "elevation", "area")
RANGES = {"population": (1000, 9999), "elevation": (100, 999), "area": (10, 99)}
SPLITS = ("train", "dev", "test")
TEMPLATE = "hop2"
TOOL = "arpo.data.hop2:lookup"
_ONSETS = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "st",
           "tr", "sh", "th"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_CODAS = ["", "n", "r", "l", "s", "m", "nd", "rk"]


def _name(rng: random.Random, onsets: list[str], vowels: list[str], codas: list[str],
          syllables: int | tuple[int, ...]) -> str:
    n = syllables if isinstance(syllables, int) else rng.choice(syllables)  # a fixed count draws nothing
    return "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(n)).capitalize()


def town_names(rng: random.Random, n: int, codas: list[str] = _CODAS, syllables: int | tuple[int, ...] = 2,
               onsets: list[str] = _ONSETS, vowels: list[str] = _VOWELS) -> list[str]:
    """`n` distinct made-up names of 4-10 letters, each `syllables` onset+vowel+coda syllables (a tuple:
    the count drawn from it per name), drawn from `rng` in order (webhop's and experiments/kbenv.py's
    towns too)."""
    names: list[str] = []
    while len(names) < n:
        nm = _name(rng, onsets, vowels, codas, syllables)
        if 4 <= len(nm) <= 10 and nm not in names:
            names.append(nm)
    return names


def derangement(rng: random.Random, names: list[str], avoid: dict[str, str] | None = None) -> dict[str, str]:
    """A random map name -> other name, a permutation with no fixed point (and != avoid[name])."""
    while True:
        perm = names[:]
        rng.shuffle(perm)
        if all(a != b and (avoid is None or avoid[a] != b) for a, b in zip(names, perm, strict=True)):
            return dict(zip(names, perm, strict=True))


def make_kb(n: int = N_TOWNS, seed: int = SEED) -> list[dict]:
    """`n` towns {name, twin, rival, population, elevation, area, facts}: distinct names (4-10
    letters), twin and rival derangements (twin != rival), numbers distinct per attribute, `facts`
    the page's sentences in their shuffled order."""
    rng = random.Random(f"hop2-kb:{seed}")
    names = town_names(rng, n)
    twin = derangement(rng, names)
    rival = derangement(rng, names, avoid=twin)
    values = {a: rng.sample(range(lo, hi + 1), n) for a, (lo, hi) in RANGES.items()}
    towns = []
    for i, nm in enumerate(names):
        t = {"name": nm, "twin": twin[nm], "rival": rival[nm], **{a: values[a][i] for a in ATTRIBUTES}}
        facts = [f"twin town {t['twin']}.", f"rival town {t['rival']}."] + [f"{a} {t[a]}." for a in ATTRIBUTES]
        rng.shuffle(facts)
        towns.append({**t, "facts": facts})
    return towns


def page(town: dict) -> str:
    """What `lookup` returns for a town: `Name: fact. fact. ...`."""
    return f"{town['name']}: " + " ".join(town["facts"])


def make_questions(kb: list[dict], seed: int = SEED) -> dict[str, list[dict]]:
    """{split: examples}: every (town, relation, attribute) question, split by the first-hop town.
    An example: {id, question, answers, task: math, hop1, relation, hop2, attribute, cluster, split};
    `cluster` (hop1/relation) names the three questions that differ only in the attribute read last."""
    return two_hop_questions(kb, "hop2", seed, ATTRIBUTES, lambda x, rel, y: {"cluster": f"{x}/{rel}"})


def two_hop_questions(towns: list[dict], name: str, seed: int, attributes: tuple[str, ...],
                      extra: Callable[[str, str, dict], dict]) -> dict[str, list[dict]]:
    """{split: examples} of "What is the A of the R town of X?" for every town X, relation R and
    attribute A, split by X (TRAIN_TOWNS / DEV_TOWNS / TEST_TOWNS towns, shuffled with `name` and
    `seed`); each row {id: name-split-i, question, answers, task, hop1, relation, hop2, attribute,
    **extra(X, R, the related town), split}, rows shuffled per split (hop2's and webhop's questions)."""
    by_name = {t["name"]: t for t in towns}
    order = [t["name"] for t in towns]
    random.Random(f"{name}-split:{seed}").shuffle(order)
    cut = {"train": order[:TRAIN_TOWNS], "dev": order[TRAIN_TOWNS:TRAIN_TOWNS + DEV_TOWNS],
           "test": order[TRAIN_TOWNS + DEV_TOWNS:TRAIN_TOWNS + DEV_TOWNS + TEST_TOWNS]}
    out: dict[str, list[dict]] = {}
    for split in SPLITS:
        rows = []
        for x in cut[split]:
            for rel in RELATIONS:
                y = by_name[by_name[x][rel]]
                for a in attributes:
                    rows.append({"question": f"What is the {a} of the {rel} town of {x}?", "answers": [str(y[a])],
                                 "task": "math", "hop1": x, "relation": rel, "hop2": y["name"], "attribute": a,
                                 **extra(x, rel, y)})
        random.Random(f"{name}-order:{seed}:{split}").shuffle(rows)
        out[split] = [{"id": f"{name}-{split}-{i}", **r, "split": split} for i, r in enumerate(rows)]
    return out


# ---- the tool ------------------------------------------------------------------------------------
def data_dir() -> Path:
    return BUILTIN_DIR / "hop2"


@functools.lru_cache(maxsize=1)
def _pages() -> dict[str, str]:
    kb = read_jsonl_gz(data_dir() / "kb.jsonl.gz")
    return {t["name"].lower(): page(t) for t in kb}


def lookup(town: str) -> str:
    """Look up a town in the hop2 knowledge base by its exact name.

    Args:
        town: the town's name, e.g. Belmor
    """
    key = town.strip().strip(".").strip().lower()
    got = _pages().get(key)
    return got if got is not None else f"No town named {town.strip()!r}."


# ---- questions -----------------------------------------------------------------------------------
def parse_question(question: str) -> tuple[str, str, str]:
    """(attribute, relation, first-hop town) of "What is the A of the R town of X?"."""
    m = re.fullmatch(r"What is the (\w+) of the (\w+) town of (\w+)\?", question.strip())
    if m is None:
        raise ValueError(f"not a hop2 question: {question!r}")
    return m.group(1), m.group(2), m.group(3)


# ---- files ---------------------------------------------------------------------------------------
def files(seed: int = SEED) -> dict[str, bytes]:
    """The dataset's files (name -> bytes): kb.jsonl.gz and one file per split."""
    kb = make_kb(seed=seed)
    qs = make_questions(kb, seed)
    return {"kb.jsonl.gz": jsonl_gz_bytes(kb), **{f"{s}.jsonl.gz": jsonl_gz_bytes(qs[s]) for s in SPLITS}}


def write(out_dir: str | Path, seed: int = SEED) -> list[Path]:
    return write_files(files(seed), out_dir)


def write_files(blobs: dict[str, bytes], out_dir: str | Path) -> list[Path]:
    """Write {name: bytes} into `out_dir` (made if missing); the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in blobs.items():
        (out / name).write_bytes(data)
        paths.append(out / name)
    return paths


if __name__ == "__main__":  # python -m arpo.data.hop2 [OUT_DIR]: regenerate the shipped files
    for p in write(sys.argv[1] if len(sys.argv) > 1 else data_dir()):
        print(p)
