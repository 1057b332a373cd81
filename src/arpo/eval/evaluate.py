"""Evaluation: run the agent k times per question with real tools, score with the reward's
correctness check, and report pass@1 (mean over samples), pass@k (unbiased estimator), F1/EM or
math accuracy, format-error rate, tool calls per tool and response length (spec §6).

pass@k for n samples with c correct (Chen et al. 2021): 1 − C(n−c, k) / C(n, k).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from arpo.data.prompts import prompts_for
from arpo.errors import ArpoError
from arpo.eval.deep_search import WEB_TOOLS, trajectory_stats
from arpo.eval.deep_search import summarize as deep_summary
from arpo.settings import AgentConfig


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(records: list[dict], samples: int) -> dict:
    """Aggregate per-sample records {example_id, correct, score, format_ok, tool_calls{tool: n},
    response_tokens} into the metrics of one dataset."""
    by_ex: dict[str, list[dict]] = {}
    for r in records:
        by_ex.setdefault(r["example_id"], []).append(r)
    ks = sorted({1, samples})
    out: dict = {"questions": len(by_ex), "samples": samples}
    for k in ks:
        out[f"pass@{k}"] = statistics.fmean(
            pass_at_k(len(rs), sum(r["correct"] for r in rs), k) for rs in by_ex.values())
    out["score"] = statistics.fmean(r["score"] for r in records)  # F1 for QA, 0/1 for math
    out["reward"] = statistics.fmean(r.get("reward", 0.0) for r in records)  # spec §5, incl. −1 format errors
    out["format_error_rate"] = statistics.fmean(not r["format_ok"] for r in records)
    # follows the protocol *and* uses a tool: what cold-start SFT and RL should raise
    out["tool_format_rate"] = statistics.fmean(r["format_ok"] and sum(r["tool_calls"].values()) > 0 for r in records)
    tools = sorted({t for r in records for t in r["tool_calls"]})
    out["tool_calls"] = statistics.fmean(sum(r["tool_calls"].values()) for r in records)
    for t in tools:
        out[f"tool_calls/{t}"] = statistics.fmean(r["tool_calls"].get(t, 0) for r in records)
    out["response_tokens"] = statistics.fmean(r["response_tokens"] for r in records)
    ds = [r["deep_search"] for r in records if "deep_search" in r]
    if ds:  # the web tools were enabled: searches, pages read, supporting pages opened, answers on a page
        out.update({f"deep_search/{k}": v for k, v in deep_summary(ds).items()})
    return out


def prompt_tools(tools, tool_names: list[str] | None):
    """What the prompt describes: the registry itself (its tools describe themselves), or the subset
    `tool_names` of it. A name the registry does not have is an error: a plug-in's `module:function`
    spec is not its tool's name, and describing it would leave the model a prompt without that tool."""
    if tool_names is None:
        return tools
    unknown = [n for n in tool_names if n not in tools.names]
    if unknown:
        raise ArpoError(f"tool_names {unknown} are not tools of the registry ({', '.join(tools.names)}); pass the "
                        "tools' names (e.g. 'lookup', not the 'module:function' spec that enabled it)")
    return list(tool_names)


def _batch_beat(heartbeat, k: int, n: int):
    """The agent loop's `on_step` that tells `heartbeat` how batch k of n goes (None without one)."""
    if heartbeat is None:
        return None

    def on_step(outs, states) -> None:
        def line() -> str:
            done = sum(st.finish_reason is not None for st in states.values())
            calls = sum(len(st.calls) for st in states.values())
            return f"batch {k}/{n}: generating, {done}/{len(states)} answers finished, {calls} tool calls"
        heartbeat.beat(line)
    return on_step


def evaluate(engine, tools, tok, examples: list[dict], *, reward_fn, agent: AgentConfig | None = None,
             samples: int = 1, temperature: float = 0.0, template: str | None = None,
             tool_names: list[str] | None = None, seed: int = 0, math_scorer: str = "math_equal",
             batch_size: int = 16, progress=None, records_out: list | None = None, heartbeat=None,
             done: list[dict] | None = None, on_batch=None) -> dict:
    """Metrics of one dataset. Greedy (temperature 0) with samples=1 gives deterministic numbers.
    `progress(n)`: n answers finished (per batch); `heartbeat`: a training.progress.Heartbeat told
    how a batch's generation goes while it runs. `done`: the records of the first samples, finished
    before (a resumed evaluation: those samples are skipped, each later one seeded as without them);
    `on_batch(start, records)`: each finished batch's records, `start` its first sample's index."""
    from arpo.rollout.agent import AgentLoop  # noqa: PLC0415 - loads torch; kept out of this light module's import

    cfg = dataclasses.replace(agent or AgentConfig(), temperature=temperature)
    loop = AgentLoop(engine, tools, cfg)
    names = prompt_tools(tools, tool_names)
    from arpo.engine.base import check_prompt_fits  # noqa: PLC0415 - loads torch; kept out of this light module's import

    rendered = prompts_for(examples, tok, names, template, cfg.tool_format)  # once per question
    for ex, p in zip(examples, rendered, strict=True):  # all of them before the first generation
        check_prompt_fits(len(p), engine.context_len, f"the prompt of {ex['id']}")
    jobs = [(i, s) for i in range(len(examples)) for s in range(samples)]
    web = any(n in tools.names for n in WEB_TOOLS)  # deep search: per-record search and reading metrics
    records = list(done or [])
    try:  # an interrupted evaluation still hands over the answers it finished
        for b in range(len(records), len(jobs), batch_size):
            chunk = [(examples[i], s, rendered[i]) for i, s in jobs[b : b + batch_size]]
            prompts = [p for _, _, p in chunk]
            on_step = _batch_beat(heartbeat, b // batch_size + 1, -(-len(jobs) // batch_size))
            trajs = loop.run(prompts, seeds=[seed * 1_000_003 + b + i for i in range(len(chunk))], on_step=on_step,
                             examples=[ex for ex, _, _ in chunk])
            for (ex, s, _), tr in zip(chunk, trajs, strict=True):
                calls = [{"tool": c.tool, "ok": c.ok, "meta": c.meta} for c in tr.tool_calls]
                res = reward_fn(tr.text, ex, tool_calls=calls, math_scorer=math_scorer, tools=tools.names,
                                tool_spans=tr.tool_spans, finish_reason=tr.finish_reason)
                counts: dict[str, int] = {}
                for c in tr.tool_calls:
                    counts[c.tool] = counts.get(c.tool, 0) + 1
                records.append({"example_id": ex["id"], "sample": s, "correct": bool(res.correct),
                                "score": float(res.score), "reward": float(res.reward),
                                "format_ok": bool(res.format_ok),
                                "answer": res.answer, "gold": ex["answers"], "tool_calls": counts,
                                "response_tokens": tr.n_generated_tokens, "finish_reason": tr.finish_reason,
                                "text": tr.text, "tool_spans": [list(sp) for sp in tr.tool_spans]})
                if web:
                    records[-1]["deep_search"] = trajectory_stats(
                        [{"tool": c.tool, "input": c.input, "output": c.output, "ok": c.ok} for c in tr.tool_calls],
                        res.answer, ex.get("supporting"))
                engine.release(tr.sid)
            if on_batch is not None:
                on_batch(b, records[-len(chunk):])
            if progress is not None:
                progress(len(chunk))
    finally:
        if records_out is not None:
            records_out.extend(records)
    return summarize(records, samples)


COMPARE_KEYS = ("pass@1", "score", "reward", "format_error_rate", "tool_format_rate", "tool_calls", "response_tokens",
                "judge_pass@1", "paper_score")  # the last two: only in files of `arpo eval --judge` / bench: data


def compare(runs: dict[str, dict]) -> list[dict]:
    """runs: label -> an `arpo eval --out` JSON object. One row per (dataset, label) with the
    COMPARE_KEYS and, from the second label on, the change against the first label."""
    rows, first = [], None
    for label, data in runs.items():
        for ds, r in data["results"].items():
            row = {"dataset": ds, "label": label, **{k: r.get(k) for k in COMPARE_KEYS}}
            rows.append(row)
    base: dict[str, dict] = {}
    for row in rows:
        first = base.setdefault(row["dataset"], row)
        if first is not row:
            row["delta"] = {k: row[k] - first[k] for k in COMPARE_KEYS
                            if isinstance(row[k], (int, float)) and isinstance(first[k], (int, float))}
    return rows
