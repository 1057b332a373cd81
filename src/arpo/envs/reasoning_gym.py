"""reasoning-gym (`pip install 'arpo[envs]'`): its procedural generators as data specs and its own
`score_answer` as the reward (partial credit, e.g. countdown's 0.05 for a wrong expression).

    rg:countdown                        500 tasks of seed 0
    rg:basic_arithmetic?size=200&seed=3 200 tasks of seed 3 (another seed: fresh tasks, endlessly)
    rg:countdown?size=64&min_numbers=3  and the generator's own config keys

A row is `{id, question, answers: [the generator's answer], task: math, rg: {dataset, entry}}`; the
reward `rg` (rewards/env.py) grades the model's answer (its last \\boxed{}, else its answer block)
with `reasoning_gym.get_score_answer_fn(dataset)(answer, entry)`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from arpo.errors import ArpoError
from arpo.spec_query import query_pairs

DEFAULT_SIZE = 500


def _value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse(spec: str) -> tuple[str, int, int, dict]:
    """'rg:countdown?size=8&seed=1&min_numbers=3' -> ('countdown', 8, 1, {'min_numbers': 3})."""
    name, _, query = spec[3:].partition("?")
    opts = {k: _value(v) for k, v in query_pairs(query)}
    size, seed = opts.pop("size", DEFAULT_SIZE), opts.pop("seed", 0)
    if not name or not isinstance(size, int) or not isinstance(seed, int) or size < 1:
        raise ArpoError(f"{spec}: expected rg:NAME[?size=N&seed=S&KEY=VALUE...] with integer size >= 1 and seed "
                        "(e.g. rg:countdown?size=200&seed=0)")
    return name, size, seed, opts


def _rg():
    try:
        import reasoning_gym  # noqa: PLC0415 - optional extra
    except ImportError as e:
        raise ArpoError("rg: data specs need reasoning-gym (pip install 'arpo[envs]')") from e
    return reasoning_gym


def iter_rows(spec: str) -> Iterator[tuple[str, dict]]:
    name, size, seed, opts = parse(spec)
    rg = _rg()
    try:
        ds = rg.create_dataset(name, size=size, seed=seed, **opts)
    except Exception as e:  # unknown name, bad config key: one line
        raise ArpoError(f"{spec}: reasoning-gym cannot make it ({type(e).__name__}: {e})") from e
    base = spec.split("?", 1)[0]
    for i in range(size):
        entry = ds[i]
        answer = entry.get("answer")
        yield f"{spec} task {i}", {"id": f"{base}:{seed}:{i}", "question": entry["question"],
                                   "answers": [str(answer) if answer not in (None, "") else "-"], "task": "math",
                                   "rg": {"dataset": name, "entry": entry}}


def score(dataset: str, answer: str | None, entry: dict) -> float:
    """reasoning-gym's own grade of `answer` for `entry`, in [0, 1]."""
    if answer is None:
        return 0.0
    try:
        return float(_rg().get_score_answer_fn(dataset)(answer, entry))
    except Exception as e:  # its scorer failed: one line naming the task
        raise ArpoError(f"reasoning-gym's score_answer of {dataset} raised {type(e).__name__}: {e}") from e
