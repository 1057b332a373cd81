"""Cold-start SFT data from real datasets with real tool outputs — no external LLM (spec §6).

* GSM8K: the worked solution's calculator annotations `<<48/2=24>>` become one `<python>` program
  that prints each step; the program is run in the real sandbox and its real output is the
  `<result>`. Rows whose last printed value is not the gold answer are dropped (counted).
* HotpotQA: each supporting-fact title becomes a `<search>` call answered by the real local index;
  rows whose results do not contain the gold answer (yes/no answers excepted) are dropped.

Row: {id, task, question, answers, system, response, tool_results: [[start, end], ...], source};
`tool_results` are the character spans of the environment-inserted result blocks, which the SFT
loss masks out (recipes/sft.py).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

from arpo.tools.base import RESULT_CLOSE, RESULT_OPEN, format_result

_ANNOT = re.compile(r"<<([^=<>]+)=([^<>]*)>>")


def result_spans(response: str) -> list[tuple[int, int]]:
    """Character spans of the "\\n<result>\\n…\\n</result>\\n" blocks format_result inserts."""
    spans, pos = [], 0
    while True:
        s = response.find("\n" + RESULT_OPEN + "\n", pos)
        if s < 0:
            return spans
        e = response.find("\n" + RESULT_CLOSE + "\n", s)
        if e < 0:
            return spans
        e += len(RESULT_CLOSE) + 2
        spans.append((s, e))
        pos = e


def _num(s: str) -> float | None:
    try:
        return float(s.strip().replace(",", "").rstrip("."))
    except ValueError:
        return None


def _assemble(parts: list[tuple[str, str]]) -> tuple[str, list[list[int]]]:
    """parts: (text, kind) with kind 'model' or 'result' -> (response, result spans)."""
    out, spans = "", []
    for text, kind in parts:
        if kind == "result":
            spans.append([len(out), len(out) + len(text)])
        out += text
    return out, spans


def gsm8k_to_sft(example: dict, python_tool, max_chars: int = 1500) -> tuple[dict | None, str]:
    """(row, "ok") or (None, reason)."""
    sol = example.get("solution") or ""
    body, _, final = sol.rpartition("####")
    gold = final.strip().replace(",", "")
    exprs = [m.group(1).strip() for m in _ANNOT.finditer(body)]
    if not exprs:
        return None, "no calculator annotations"
    cot = " ".join(line.strip() for line in _ANNOT.sub("", body).splitlines() if line.strip())
    code = "\n".join(f"print({e})" for e in exprs)
    r = python_tool(code)
    if not r.ok:
        return None, "program failed"
    lines = [x for x in r.output.strip().splitlines() if x.strip()]
    last = _num(lines[-1]) if lines else None
    g = _num(gold)
    if last is None or g is None or abs(last - g) > 1e-6 * max(1.0, abs(g)):
        return None, "program output != gold answer"
    response, spans = _assemble([
        (f"<think> {cot} </think>\n<python>\n{code}\n</python>", "model"),
        (format_result(r.output.strip()), "result"),
        (f"<think> The result is {gold}. </think>\n<answer> \\boxed{{{gold}}} </answer>", "model"),
    ])
    if len(response) > max_chars:
        return None, "too long"
    return {"id": example["id"], "task": "math", "question": example["question"], "answers": [gold],
            "system": "math", "response": response, "tool_results": spans, "source": "gsm8k-annotations"}, "ok"


def hotpotqa_to_sft(row: dict, search_fn, max_calls: int = 2, require_answer: bool = True) -> tuple[dict | None, str]:
    """row: a raw HotpotQA line (needs supporting_facts). search_fn(query) -> the tool's output text."""
    from arpo.rewards.answer import normalize_answer

    answer = str(row["answer"]).strip()
    titles = list(dict.fromkeys(row.get("supporting_facts", {}).get("title", [])))[:max_calls]
    if not titles:
        return None, "no supporting facts"
    parts, found = [], answer.lower() in ("yes", "no")
    for k, t in enumerate(titles):
        lead = f"<think> I need to find information about {t}. </think>\n" if k == 0 else \
            f"<think> Next I need {t}. </think>\n"
        out = search_fn(t)
        parts += [(f"{lead}<search> {t} </search>", "model"), (format_result(out), "result")]
        found = found or normalize_answer(answer) in normalize_answer(out)
    if require_answer and not found:
        return None, "answer not in search results"
    parts.append((f"<think> From the passages, the answer is {answer}. </think>\n<answer> \\boxed{{{answer}}} </answer>",
                  "model"))
    response, spans = _assemble(parts)
    return {"id": str(row.get("id", "")), "task": "qa", "question": row["question"], "answers": [answer],
            "system": "search", "response": response, "tool_results": spans, "source": "hotpotqa-supporting-facts"}, "ok"


def build_sft_dataset(task: str, in_path: str, out_path: str, limit: int | None = None, *, search_index=None,
                      top_k: int = 3, max_chars: int = 300, progress: bool = True) -> dict:
    """Convert `limit` rows (kept rows, not read rows) and write JSONL atomically. Returns stats."""
    from rich.progress import Progress

    from arpo.errors import ArpoError
    from arpo.tools import build_tools

    if task not in ("gsm8k", "hotpotqa"):
        raise ArpoError(f"unknown SFT source {task!r}; use gsm8k or hotpotqa")
    p = Path(in_path)
    if not p.is_file():
        raise ArpoError(f"{p} does not exist")
    reasons: Counter = Counter()
    rows = []
    tools = build_tools(["python"] if task == "gsm8k" else ["search"], search_index=search_index, top_k=top_k,
                        max_chars=max_chars)
    try:
        if task == "gsm8k":
            from arpo.data.datasets import load_examples

            src = load_examples(p)
        else:
            src = []
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
                if line.strip():
                    try:
                        src.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ArpoError(f"{p}:{i}: invalid JSON ({e.msg})") from e
        with Progress(disable=not progress) as bar:
            t = bar.add_task(f"sft-data {task}", total=limit or len(src))
            for ex in src:
                if task == "gsm8k":
                    row, why = gsm8k_to_sft(ex, tools["python"])
                else:
                    row, why = hotpotqa_to_sft(ex, lambda q: tools["search"](q).output)
                reasons[why] += 1
                if row is not None:
                    rows.append(row)
                    bar.advance(t)
                if limit is not None and len(rows) >= limit:
                    break
    finally:
        tools.close()
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, out)
    return {"written": len(rows), "read": sum(reasons.values()),
            "dropped": {k: v for k, v in reasons.items() if k != "ok"}, "out": str(out)}


def rejection_rows(records: list[dict], examples: dict[str, dict], min_reward: float = 0.0,
                   per_question: int = 1) -> list[dict]:
    """Rejection sampling (issue 5, second SFT source): the model's own trajectories with reward >
    min_reward, at most `per_question` per question. `records` are arpo.eval.evaluate records."""
    out, kept = [], {}
    for r in records:
        if r["reward"] <= min_reward or kept.get(r["example_id"], 0) >= per_question:
            continue
        ex = examples[r["example_id"]]
        text = r["text"]
        for eos in ("<|im_end|>", "<|endoftext|>"):
            text = text.replace(eos, "")
        text = text.rstrip()
        kept[r["example_id"]] = kept.get(r["example_id"], 0) + 1
        out.append({"id": ex["id"], "task": ex["task"], "question": ex["question"], "answers": ex["answers"],
                    "system": r.get("template") or ("math" if ex["task"] == "math" else "search"),
                    "response": text, "tool_results": [list(s) for s in result_spans(text)],
                    "source": f"rejection-sampling(reward={r['reward']:.2f})"})
    return out


def build_rejection_dataset(model: str, data: str, out_path: str, *, samples: int = 4, temperature: float = 0.8,
                            limit: int | None = None, tools: list[str] | None = None, search_index=None,
                            top_k: int = 3, max_chars: int = 300, max_new_tokens: int = 384,
                            progress: bool = True) -> dict:
    """Sample `samples` trajectories per question with real tools, keep those with reward > 0."""
    from rich.progress import Progress

    from arpo.data.datasets import load_examples
    from arpo.engine.hf import HFEngine
    from arpo.eval.evaluate import evaluate
    from arpo.models import load_model
    from arpo.rewards import arpo_reward
    from arpo.rollout.agent import AgentConfig
    from arpo.tools import build_tools

    exs = load_examples(data, limit)
    names = tools or (["python"] if all(e["task"] == "math" for e in exs) else ["search"])
    reg = build_tools(names, search_index=search_index, top_k=top_k, max_chars=max_chars)
    m, tok = load_model(model)
    recs: list = []
    try:
        with Progress(disable=not progress) as bar:
            t = bar.add_task("rejection sampling", total=len(exs) * samples)
            stats = evaluate(HFEngine(m, tok), reg, tok, exs, reward_fn=arpo_reward,
                             agent=AgentConfig(max_response_tokens=max_new_tokens), samples=samples,
                             temperature=temperature, tool_names=names, records_out=recs,
                             progress=lambda n: bar.advance(t, n))
    finally:
        reg.close()
    rows = rejection_rows(recs, {e["id"]: e for e in exs})
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, out)
    return {"written": len(rows), "sampled": len(recs), "questions": len(exs), "pass@1": stats["pass@1"],
            "out": str(out)}
