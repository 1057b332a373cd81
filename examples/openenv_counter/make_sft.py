"""Worked trajectories of the counter task, played on the real OpenEnv server through arpo's env tool.

    python -m examples.openenv_counter.make_sft --n 200 --seed 0 --out runs/openenv_counter/sft_data.jsonl

Each task (seeds seed..seed+n-1: keep them apart from RL's and the held-out seeds) is played with the
greedy strategy: add 9 while more than 9 is missing, then the rest, reading the missing amount from
each observation; then `<answer> \\boxed{T} </answer>`. The rows are sft/rows.py's `system_prompt`
form, as `arpo sft-data tools` writes them: the question is the environment's reset observation, the
system prompt the one the rollout renders for these tools, and each result block the tool's real
observation in the rollout's markup, so SFT sees byte for byte what RL and eval show the model.
(`arpo sft-data tools` cannot play an environment: its calls have no episode.)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace

from arpo.data.prompts import system_prompt, templates_for, tool_schema
from arpo.envs.spec import close_all, iter_rows
from arpo.errors import ArpoError
from arpo.jsonl import write_jsonl
from arpo.settings import ToolsConfig
from arpo.sft.rows import assemble
from arpo.tools import tools_from_config
from arpo.tools.base import ToolCall, format_result

SPEC = "openenv:examples.openenv_counter.counter_env:app"
_NEED = re.compile(r"need (\d+) more")
_TASK = re.compile(r"Reach exactly (\d+) .* The total starts at (\d+)\.")


def greedy_action(missing: int) -> int:
    """The number to add when `missing` is still missing: 9 while more than 9 is, else all of it."""
    return 9 if missing > 9 else missing


def play(reg, key: str, row: dict) -> dict:
    """One row's greedy trajectory through the registry's env tool -> an SFT row."""
    reg.bind_sessions({key: row})
    m = _TASK.match(row["question"])
    if m is None:
        raise ArpoError(f"{row['id']}: not a counter task: {row['question'][:80]!r}")
    t, start = int(m.group(1)), int(m.group(2))
    missing, parts = t - start, []
    try:
        for _ in range(t):  # at most t additions of at least 1
            n = greedy_action(missing)
            r = reg.run(ToolCall("env", str(n), session=key))
            if not r.ok:
                raise ArpoError(f"{row['id']}: the environment answered {n} with {r.output!r}")
            parts += [(f"<env> {n} </env>", "model"), (format_result(r.output), "result")]
            if r.meta.get("env_done"):
                if r.meta.get("env_reward") != 1.0:
                    raise ArpoError(f"{row['id']}: the greedy trajectory was paid {r.meta.get('env_reward')}, not 1")
                break
            need = _NEED.search(r.output)
            if need is None:
                raise ArpoError(f"{row['id']}: no 'need N more' in the observation {r.output!r}")
            missing = int(need.group(1))
    finally:
        reg.end_sessions([key])
    parts.append((f"<answer> \\boxed{{{t}}} </answer>", "model"))
    response, spans = assemble(parts)
    return {"id": row["id"], "task": row["task"], "question": row["question"], "answers": [str(t)],
            "response": response, "tool_results": spans, "source": "openenv-counter-greedy"}


def make_rows(n: int, seed: int, spec: str = SPEC) -> list[dict]:
    """SFT rows of the tasks seed..seed+n-1 (the data spec's rows, played by the tools spec's env tool)."""
    rows = [r for _, r in iter_rows(f"{spec}?n={n}&seed={seed}")]
    reg = tools_from_config(replace(ToolsConfig(), enabled=[spec], mcp=[], options={}))
    try:
        (template,) = templates_for(rows, reg, None)  # what the rollout renders for these rows and tools
        system = system_prompt(template, reg)
        schemas = [tool_schema(reg[name]) for name in reg.names]
        out = []
        for i, row in enumerate(rows):
            r = play(reg, f"sft-{i}", row)
            out.append({**r, "system_prompt": system, "tools": schemas, "tool_format": "tags"})
        return out
    finally:
        reg.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200, help="tasks (rows)")
    p.add_argument("--seed", type=int, default=0, help="the first task's seed")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    try:
        rows = make_rows(a.n, a.seed)
    except ArpoError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        close_all()
    write_jsonl(a.out, rows)
    print(json.dumps({"written": len(rows), "out": a.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
