"""The RL task set of examples/deep_search/run_hotpotqa.sh: the last N questions of a training split that
the SFT data does not hold (its rows' ids), as JSONL examples for `arpo train`.

    python examples/deep_search/rl_tasks.py SFT.jsonl OUT.jsonl [--data hotpotqa:train] [-n 2]

`arpo web sft-data` reads a split from its first row on, so its last rows are the ones it is least
likely to have read; questions it read and dropped (the page was not found) are fair RL tasks:
no SFT row was made from them."""

from __future__ import annotations

import argparse
import json

from arpo.data.datasets import load_examples
from arpo.errors import ArpoError


def pick(rows: list[dict], sft_ids: set, n: int) -> list[dict]:
    """The last n rows (in their order) whose id is not in sft_ids."""
    fresh = [r for r in rows if r["id"] not in sft_ids]
    if len(fresh) < n:
        raise ArpoError(f"only {len(fresh)} training questions are not in the SFT data; {n} wanted")
    return fresh[-n:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sft"), p.add_argument("out")
    p.add_argument("--data", default="hotpotqa:train"), p.add_argument("-n", type=int, default=2)
    a = p.parse_args(argv)
    with open(a.sft, encoding="utf-8") as f:
        sft_ids = {json.loads(line)["id"] for line in f if line.strip()}
    tasks = pick(load_examples(a.data), sft_ids, a.n)
    with open(a.out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in tasks)
    print(json.dumps({"tasks": len(tasks), "ids": [r["id"] for r in tasks], "sft_rows": len(sft_ids), "out": a.out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
