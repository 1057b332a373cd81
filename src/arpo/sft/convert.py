"""Cold-start SFT rows from real datasets with real tool outputs — no external LLM (spec §6).

* GSM8K: each line of the worked solution with calculator annotations `<<48/2=24>>` becomes a
  `<python>` call printing its expressions, run in the real sandbox; its real output is the
  `<result>`. The thought before a call says what to compute, not the result (the model has not
  seen it yet), so the trajectories teach using the tool rather than copying numbers. Every printed
  value must match its annotation and the last one the gold answer, or the row is dropped (counted).
* HotpotQA: each supporting-fact title becomes a `<search>` call answered by the real local index;
  rows whose results do not contain the gold answer (yes/no answers excepted) are dropped.
* SVAMP / MAWPS / ASDiv-A (`svamp:train`): the row's python expression becomes one
  `<python>print(expr)</python>` call run in the real sandbox; rows whose output is not the answer
  are dropped. The system prompt is the short `calc` template.
* hop2: the task's scripted trajectory through the real lookup tool (`hop2_response`).
* rejection sampling: the model's own trajectories with reward > 0 (`rejection_rows`).
* your own tools: worked examples `{question, calls, answer}` run through the real tools (`tools_to_sft`).

Each converter returns (row, "ok") or (None, the reason it was dropped); the row layout: sft/rows.py.
The recipes that write them: recipes/sft_data.py (`arpo sft-data`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

from arpo.data import hop2
from arpo.data.datasets import supporting_titles as titles
from arpo.data.prompts import system_prompt
from arpo.errors import ArpoError
from arpo.rewards.answer import normalize_answer
from arpo.rollout.tool_formats import get_format, tool_schema
from arpo.settings import ToolsConfig
from arpo.sft.rows import assemble, result_spans
from arpo.tools import tools_from_config
from arpo.tools.base import RESULT_OPEN, ToolCall, format_result

_ANNOT = re.compile(r"<<([^<>]*)=([^<>=]*)>>")


def _num(s: str) -> float | None:
    s = s.strip().replace(",", "").rstrip(".").lstrip("$")
    try:
        v = float(s)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _same(output: str, value: str) -> bool:
    """A printed value equals an annotation's value (up to the annotation's rounding: `<<10/3=3.33>>`)."""
    got, want = _num(output), _num(value)
    if got is None or want is None:
        return False
    if abs(got - want) <= 1e-6 * max(1.0, abs(want)):
        return True
    v = value.strip().replace(",", "")
    decimals = len(v.split(".", 1)[1]) if "." in v else 0
    return abs(got - want) <= 0.5 * 10 ** (-decimals) + 1e-9


def _tidy(s: str) -> str:
    s = re.sub(r"[ \t]{2,}", " ", s).strip()
    return re.sub(r"\s+([.,;:!?])", r"\1", s)


def _split_line(line: str) -> tuple[str, str, list[tuple[str, str]]]:
    """One solution line -> (thought *before* the call: the annotated results removed, since the
    model has not seen them yet; thought *after* it, values kept; [(expression, value)])."""
    before, after, calls, cur = [], [], [], 0
    for m in _ANNOT.finditer(line):
        expr, val = m.group(1).strip(), m.group(2).strip()
        if not expr or not val:
            raise _Drop("bad annotation")
        calls.append((expr, val))
        head, end = line[cur:m.start()], m.end()
        shown = line[end:end + len(val)] == val  # "48/2 = <<48/2=24>>24": the value follows the annotation
        if shown:
            end += len(val)
        after.append(head + ("" if shown else val) + line[m.end():end])
        h = head.rstrip().removesuffix("$").rstrip()
        before.append(h[:-1].rstrip() + " " if h.endswith("=") else head + expr)
        cur = end
    before.append(line[cur:])
    after.append(line[cur:])
    return _tidy("".join(before)), _tidy("".join(after)), calls


class _Drop(Exception):
    pass


def _steps(body: str, max_calls: int) -> tuple[list[dict], str]:
    """Solution lines with calculations -> steps {think, post, calls}, merged down to max_calls."""
    steps: list[dict] = []
    pending: list[str] = []
    for line in (x.strip() for x in body.splitlines()):
        if not line:
            continue
        pre, post, calls = _split_line(line)
        if calls:
            steps.append({"think": " ".join(pending + [pre]), "post": post, "calls": calls})
            pending = []
        else:
            pending.append(pre)
    if len(steps) > max_calls:  # merge neighbouring lines into max_calls groups of near-equal size
        merged: list[dict] = []
        i = 0
        for g in range(max_calls):
            size = len(steps) // max_calls + (1 if g < len(steps) % max_calls else 0)
            grp, i = steps[i:i + size], i + size
            merged.append({"think": " ".join(s["think"] for s in grp), "post": " ".join(s["post"] for s in grp),
                           "calls": [c for s in grp for c in s["calls"]]})
        steps = merged
    return steps, " ".join(pending)


def gsm8k_to_sft(example: dict, python_tool, max_chars: int = 1500, max_calls: int = 3,
                 style: str = "single") -> tuple[dict | None, str]:
    """(row, "ok") or (None, reason).

    style "stepwise" (default): one `<python>` call per solution line (merged down to `max_calls`),
    the thought before each call states what to compute without its result, and every printed value
    is checked against its annotation. style "single": one program printing every annotation."""
    sol = example.get("solution") or ""
    body, _, final = sol.rpartition("####")
    gold = final.strip().replace(",", "")
    if not _ANNOT.search(body):
        return None, "no calculator annotations"
    if _num(gold) is None:
        return None, "gold answer is not a number"
    if style == "single":
        exprs = [m.group(1).strip() for m in _ANNOT.finditer(body)]
        cot = " ".join(line.strip() for line in _ANNOT.sub("", body).splitlines() if line.strip())
        code = "\n".join(f"print({e})" for e in exprs)
        r = python_tool(code)
        if not r.ok:
            return None, "program failed"
        lines = [x for x in r.output.strip().splitlines() if x.strip()]
        if not lines or not _same(lines[-1], gold):
            return None, "program output != gold answer"
        parts = [(f"<think> {cot} </think>\n<python>\n{code}\n</python>", "model"),
                 (format_result(r.output.strip()), "result"),
                 (f"<think> The result is {gold}. </think>\n<answer> \\boxed{{{gold}}} </answer>", "model")]
    elif style == "stepwise":
        try:
            steps, tail = _steps(body, max_calls)
        except _Drop as e:
            return None, str(e)
        parts, values = [], []
        for st in steps:
            code = "\n".join(f"print({e})" for e, _ in st["calls"])
            r = python_tool(code)
            outs = r.output.strip().splitlines()
            if not r.ok:
                return None, "program failed"
            if len(outs) != len(st["calls"]) or not all(_same(o, v)
                                                     for o, (_, v) in zip(outs, st["calls"], strict=True)):
                return None, "program output != annotation"
            values += outs
            parts += [(f"<think> {st['think']} </think>\n<python>\n{code}\n</python>", "model"),
                      (format_result(r.output.strip()), "result")]
        if not values or not _same(values[-1], gold):
            return None, "program output != gold answer"
        concl = _tidy(" ".join(x for x in (steps[-1]["post"], tail) if x))
        parts.append((f"<think> {concl} </think>\n<answer> \\boxed{{{gold}}} </answer>", "model"))
    else:
        raise ValueError(f"style must be stepwise or single, not {style!r}")
    response, spans = assemble(parts)
    if RESULT_OPEN in "".join(t for t, k in parts if k == "model"):
        return None, "result tag in model text"
    if [list(s) for s in result_spans(response)] != spans:
        return None, "ambiguous result spans"
    if len(response) > max_chars:
        return None, "too long"
    return {"id": example["id"], "task": "math", "question": example["question"], "answers": [gold],
            "system": "math", "response": response, "tool_results": spans,
            "source": f"gsm8k-annotations({style})"}, "ok"


def _expr(equation: str) -> str:
    """'( 56 * 9 )' -> '56 * 9': spaces tidied, one pair of redundant outer parentheses dropped."""
    e = re.sub(r"\s+", " ", equation.strip())
    e = re.sub(r"\( ", "(", re.sub(r" \)", ")", e))
    if e.startswith("(") and e.endswith(")"):
        depth = 0
        for i, c in enumerate(e):
            depth += c == "("
            depth -= c == ")"
            if depth == 0 and i < len(e) - 1:
                break
        else:
            e = e[1:-1].strip()
    return e


def svamp_to_sft(example: dict, python_tool) -> tuple[dict | None, str]:
    """An arithmetic word problem with its python expression (`example["equation"]`) -> one call
    `<python>print(expr)</python>` run in the sandbox, then the boxed answer. (row, "ok") or (None, reason)."""
    eq = example.get("equation")
    if not isinstance(eq, str) or not eq.strip():
        return None, "no equation"
    gold = example["answers"][0]
    code = f"print({_expr(eq)})"
    r = python_tool(code)
    if not r.ok:
        return None, "program failed"
    out = r.output.strip()
    if not _same(out, gold):
        return None, "program output != gold answer"
    parts = [(f"<think> I write the calculation as one python expression. </think>\n<python>{code}</python>", "model"),
             (format_result(out), "result"),
             (f"<answer> \\boxed{{{gold}}} </answer>", "model")]
    response, spans = assemble(parts)
    return {"id": example["id"], "task": "math", "question": example["question"], "answers": [gold],
            "system": "calc", "response": response, "tool_results": spans, "source": "svamp-equation"}, "ok"


def supporting_titles(row: dict, n: int) -> list[str]:
    """The first `n` distinct titles of a row's supporting pages, in order (one search each): HotpotQA's
    supporting facts, MuSiQue's paragraphs marked is_supporting, or a `supporting` list (data.datasets)."""
    return titles(row)[:n]


def hop_thought(k: int, title: str) -> str:
    """The worked example's thought before its k-th search (k from 0), for the page `title`."""
    return f"<think> I need to find information about {title}. </think>\n" if k == 0 else \
        f"<think> Next I need {title}. </think>\n"


def hotpotqa_to_sft(row: dict, search_fn, max_calls: int = 2, require_answer: bool = True) -> tuple[dict | None, str]:
    """row: a raw HotpotQA line (needs supporting_facts). search_fn(query) -> the tool's output text."""
    answer = str(row["answer"]).strip()
    titles = supporting_titles(row, max_calls)
    if not titles:
        return None, "no supporting facts"
    parts, found = [], answer.lower() in ("yes", "no")
    for k, t in enumerate(titles):
        out = search_fn(t)
        parts += [(f"{hop_thought(k, t)}<search> {t} </search>", "model"), (format_result(out), "result")]
        found = found or normalize_answer(answer) in normalize_answer(out)
    if require_answer and not found:
        return None, "answer not in search results"
    parts.append((f"<think> From the passages, the answer is {answer}. </think>\n"
                   f"<answer> \\boxed{{{answer}}} </answer>", "model"))
    response, spans = assemble(parts)
    return {"id": str(row.get("id", "")), "task": "qa", "question": row["question"], "answers": [answer],
            "system": "search", "response": response, "tool_results": spans,
            "source": "hotpotqa-supporting-facts"}, "ok"


def hop2_response(example: dict, call) -> tuple[str, list[list[int]]]:
    """hop2's scripted correct trajectory of `example` through `call` (the lookup tool: town -> page):
    (response, the [start, end) spans of the result blocks). The second call's argument is read from
    the first result, not from the example, so a broken tool gives a wrong trajectory, not a right one."""
    a, rel, x = hop2.parse_question(example["question"])
    first = call(x)
    marker = f"{rel} town "
    y = first.split(marker, 1)[1].split(".", 1)[0] if marker in first else "?"
    second = call(y)
    value = second.split(f"{a} ", 1)[1].split(".", 1)[0] if f"{a} " in second else "?"
    pieces = [(f"<think>The {rel} town of {x}, then its {a}.</think>\n<lookup>{x}</lookup>", True),
              (format_result(first), False), (f"<lookup>{y}</lookup>", True), (format_result(second), False),
              (f"<answer>\\boxed{{{value}}}</answer>", True)]
    text, spans = assemble([(piece, "model" if generated else "result") for piece, generated in pieces])
    return text, spans


def hop2_one_call_guesses(example: dict, call) -> list[str]:
    """Every number on hop2's first page: the answers a policy that stops after one lookup can give."""
    return re.findall(r"\d+", call(hop2.parse_question(example["question"])[2]))


def hop2_sft_rows(examples: list[dict], tools_cfg: ToolsConfig | None = None) -> list[dict]:
    """SFT rows (sft/rows.py's `system_prompt` form) of hop2's scripted trajectories through the real
    lookup tool, as RL builds them; the prompt is the one the rollouts render (template hop2).
    `arpo sft-data hop2` and `arpo experiment hop2-arpo-vs-grpo` write these rows."""
    for ex in examples:  # rows that are not hop2's were a ValueError traceback
        try:
            hop2.parse_question(ex["question"])
        except ValueError:
            raise ArpoError(f"hop2: row {ex['id']}: {ex['question'][:80]!r} is not a hop2 question (\"What is the A of "
                            "the R town of X?\", hop2:train); other rows: arpo sft-data hotpotqa / tools") from None
    reg = tools_from_config(replace(tools_cfg or ToolsConfig(), enabled=[hop2.TOOL], mcp=[], options={}))
    try:
        system = system_prompt(hop2.TEMPLATE, reg)
        schema = tool_schema(reg["lookup"])
        rows = []
        for ex in examples:
            text, spans = hop2_response(ex, lambda q: reg.run(ToolCall("lookup", q)).output)
            rows.append({"id": ex["id"], "question": ex["question"], "answers": ex["answers"], "task": "math",
                         "response": text, "tool_results": spans, "system_prompt": system, "tools": [schema]})
        return rows
    finally:
        reg.close()


def rejection_rows(records: list[dict], examples: dict[str, dict], min_reward: float = 0.0,
                   per_question: int = 1) -> list[dict]:
    """Rejection sampling (issue 5, second SFT source): the model's own trajectories with reward >
    min_reward, at most `per_question` per question. `records` are arpo.eval.evaluate records."""
    out: list[dict] = []
    kept: dict[str, int] = {}
    for r in records:
        if r["reward"] <= min_reward or kept.get(r["example_id"], 0) >= per_question:
            continue
        ex = examples[r["example_id"]]
        text, spans = _own_text(r["text"], r.get("tool_spans"))
        kept[r["example_id"]] = kept.get(r["example_id"], 0) + 1
        out.append({"id": ex["id"], "task": ex["task"], "question": ex["question"], "answers": ex["answers"],
                    "system": r.get("template") or ("math" if ex["task"] == "math" else "search"),
                    "response": text, "tool_results": spans,
                    "source": f"rejection-sampling(reward={r['reward']:.2f})"})
    return out


def _own_text(text: str, tool_spans) -> tuple[str, list[list[int]]]:
    """(response, result spans) of a sampled trajectory: end-of-turn text dropped from the model's
    text. With the rollout's `tool_spans` the result blocks are where the environment put them (a
    tool that printed `</result>` cannot move a block's end); records without them: found by text."""
    def own(t: str) -> str:
        for eos in ("<|im_end|>", "<|endoftext|>"):
            t = t.replace(eos, "")
        return t

    if tool_spans is None:
        text = own(text).rstrip()
        return text, [list(s) for s in result_spans(text)]
    out, spans, pos = "", [], 0
    for a, b in sorted(map(tuple, tool_spans)):
        out += own(text[pos:a])
        spans.append([len(out), len(out) + b - a])
        out += text[a:b]
        pos = b
    out = (out + own(text[pos:])).rstrip()
    return out, [[a, min(b, len(out))] for a, b in spans if a < len(out)]


# ---- your own tools: worked examples -> trajectories ---------------------------------------------
def _answer_supported(answer: str, output: str) -> bool:
    """The worked example's answer is what its last tool call returned (number or text)."""
    a, o = _num(answer), _num(output.strip().splitlines()[-1] if output.strip() else "")
    if a is not None and o is not None:
        return abs(a - o) <= 1e-6 * max(1.0, abs(a))
    return normalize_answer(answer) in normalize_answer(output)


def tools_to_sft(row: dict, tools, tokenizer, tool_format: str, system: str, schemas: list[dict],
                 where: str = "?") -> tuple[dict | None, str]:
    """A worked example `{question, calls: [{tool, arguments}], answer, thought?}` -> an SFT row made
    by running the real tools, in either call format; (None, reason) when a tool fails or the
    answer is not what the last call returned."""
    calls, answer = row.get("calls"), row.get("answer")
    if not isinstance(row.get("question"), str) or not isinstance(calls, list) or not calls or answer is None:
        return None, "needs question, a non-empty calls list and answer"
    fmt = get_format(tool_format)
    answer = str(answer).strip()
    parts, outputs = [], []
    for k, c in enumerate(calls):
        name, args = c.get("tool"), c.get("arguments", {})
        if name not in tools:
            return None, f"unknown tool {name!r}"
        tool = tools[name]
        single = tool.single_string_arg
        if tool_format == "tags":
            body = args[single] if single and isinstance(args, dict) and set(args) == {single} else (
                args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
            r = tools.run(ToolCall(name, body if isinstance(body, str) else json.dumps(body)))
            thought = c.get("thought") or (row.get("thought") if k == 0 else None) or f"I call {name}."
            model = f"<think> {thought} </think>\n<{name}>{body}</{name}>"
            result = format_result(r.output)
        else:
            a = args if isinstance(args, dict) else ({single: args} if single else {})
            r = tools.run(ToolCall(name, json.dumps(a), arguments=a))
            thought = c.get("thought") or (row.get("thought") if k == 0 else None) or f"I call {name}."
            turn = f"<think> {thought} </think>\n<tool_call>\n" + json.dumps({"name": name, "arguments": a},
                                                                           ensure_ascii=False) + "\n</tool_call>"
            model = turn + (tokenizer.eos_token or "<|im_end|>")
            result = fmt.render_results(tokenizer, turn, [ToolCall(name, "")], [r.output])
        if not r.ok:
            return None, "tool failed"
        outputs.append(r.output)
        parts.append((model, "model"))
        parts += [(result, "result")] if isinstance(result, str) else [(t, "tool" if own else "result")
                                                                       for t, own in result]
    if not _answer_supported(answer, outputs[-1]):
        return None, "answer != last tool output"
    parts.append((f"<think> The answer is {answer}. </think>\n<answer> \\boxed{{{answer}}} </answer>", "model"))
    tool_text: list = []
    response, spans = assemble(parts, tool_text)
    return {"id": str(row.get("id", where)), "task": row.get("task", "qa"), "question": row["question"],
            "answers": [answer], "system_prompt": system, "tools": schemas, "tool_format": tool_format,
            "response": response, "tool_results": spans, "tool_text": tool_text,
            "source": f"worked-example({tool_format})"}, "ok"
