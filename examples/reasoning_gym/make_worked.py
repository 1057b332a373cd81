"""Worked examples for the reasoning-gym example: each `rg:` task of the spec written as one python
call that prints its expression, and the expression's value as the answer ({question, calls, answer},
the input of `arpo sft-data tools`, which runs every call in the real sandbox and drops a row whose
answer is not what the call printed).

    python -m examples.reasoning_gym.make_worked SPEC OUT.jsonl
"""

from __future__ import annotations

import json
import sys

from arpo.data.datasets import load_examples


def worked(row: dict) -> dict:
    """A basic_arithmetic-style row -> {question, calls: [python print(expression)], answer}."""
    expression = row["rg"]["entry"]["metadata"]["expression"]
    return {"question": row["question"], "calls": [{"tool": "python", "arguments": f"print({expression})"}],
            "answer": row["answers"][0]}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    spec, out = argv
    rows = [worked(r) for r in load_examples(spec)]
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"{len(rows)} worked examples -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
