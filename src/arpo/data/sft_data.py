"""Cold-start SFT data (spec §6): agent-protocol trajectories built from the real datasets, with
the REAL outputs of the tools spliced in where the environment would put them.

One output row (one JSON line)::

    {"id", "task": "math" | "qa", "question", "answers": [str], "system": <template name>,
     "response": <assistant turn in the protocol of spec §1>,
     "tool_results": [[start, end], ...],   # char spans of the environment-inserted result blocks
     "source": "<dataset>:<file>:<line>"}

`tool_results` spans cover exactly the text `format_result(output)` appended after each call
(`"\\n<result>\\n...\\n</result>\\n"`): the model must not be trained on it (`arpo sft` masks it).

GSM8K. The worked solutions carry calculator annotations `<<48/2=24>>24`. Each solution line that
has annotations becomes one step: a `<think>` with the line's reasoning *without its results*
(the model has not seen them yet), a `<python>` call printing the annotated expressions, and the
tool's actual output. Lines without annotations join the next step's thought. When a solution has
more steps than `max_calls`, consecutive steps are merged into one program (several prints), so no
trajectory exceeds the agent's tool-call cap. The last thought restates the final line with its
values, then `<answer> \\boxed{####-answer} </answer>`. A row is dropped (and counted by reason)
when a program fails, when its output does not match the annotated values, when the gold answer
is not among the computed values, or when the response is too long.

HotpotQA. One `<search>` per supporting title (query = the title), each with the search tool's
actual output; the thought after a result quotes the supporting sentence of that page (the fact
the question needs), then the answer. Dropped when a page is not among its search results.
"""

from __future__ import annotations

import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from arpo.errors import ArpoError
from arpo.tools.base import RESULT_CLOSE, RESULT_OPEN, format_result

SFT_TASKS = ("gsm8k", "hotpotqa")
DEFAULT_MAX_CALLS = 5  # the agent's reference max_tool_calls
DEFAULT_MAX_CHARS = 1200  # about 300 tokens of the 135M model's tokenizer

_ANNOT = re.compile(r"<<([^<>]*)>>")
_RESULT_BLOCK = re.compile(r"\n" + re.escape(RESULT_OPEN) + r"\n.*?\n" + re.escape(RESULT_CLOSE) + r"\n", re.S)


class Dropped(Exception):
    """An example that cannot become a faithful trajectory; `reason` is the stats key."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


# ---------------------------------------------------------------------------------------------
# Result spans


def result_spans(response: str) -> list[tuple[int, int]]:
    """[start, end) char spans of the environment-inserted blocks `\\n<result>\\n...\\n</result>\\n`
    (exactly what `format_result` produces), in order. Tool outputs containing `</result>` would be
    cut short; the builders below drop such examples."""
    return [(m.start(), m.end()) for m in _RESULT_BLOCK.finditer(response)]


class _Response:
    """Accumulates model text and result blocks, recording the result spans as it goes."""

    def __init__(self):
        self.parts: list[str] = []
        self.n = 0
        self.spans: list[list[int]] = []

    def model(self, text: str) -> None:
        self.parts.append(text)
        self.n += len(text)

    def result(self, output: str) -> None:
        if RESULT_OPEN in output or RESULT_CLOSE in output:
            raise Dropped("result_tag_in_output")
        block = format_result(output)
        self.spans.append([self.n, self.n + len(block)])
        self.parts.append(block)
        self.n += len(block)

    def text(self) -> str:
        out = "".join(self.parts)
        if [list(s) for s in result_spans(out)] != self.spans:  # the trainer's view must agree
            raise Dropped("ambiguous_result_spans")
        return out


# ---------------------------------------------------------------------------------------------
# GSM8K


def _clean(s: str) -> str:
    s = re.sub(r"[ \t]{2,}", " ", s).strip()
    return re.sub(r"\s+([.,;:!?])", r"\1", s)


def _split_annotation(a: str) -> tuple[str, str]:
    if "=" not in a:
        raise Dropped("bad_annotation", a)
    expr, val = a.rsplit("=", 1)
    expr, val = expr.strip(), val.strip()
    if not expr or not val:
        raise Dropped("bad_annotation", a)
    return expr, val


def _render_line(line: str) -> tuple[str, str, list[tuple[str, str]]]:
    """(thought before the call: results removed, thought after: values kept, [(expr, value)])."""
    before, after, calls, cur = [], [], [], 0
    for m in _ANNOT.finditer(line):
        expr, val = _split_annotation(m.group(1))
        calls.append((expr, val))
        head = line[cur : m.start()]
        end = m.end()
        shown = line[end : end + len(val)] == val  # the value is normally repeated after >>
        if shown:
            end += len(val)
        after.append(head + (val if not shown else "") + line[m.end() : end])
        h = head.rstrip()
        cur_sym = ""
        if h.endswith("$"):
            h, cur_sym = h[:-1].rstrip(), "$"
        if h.endswith("="):  # "48/2 = <<48/2=24>>24 clips" -> "48/2 clips"
            before.append(h[:-1].rstrip() + " ")
        else:  # "has <<3*4=12>>12 apples" -> "has 3*4 apples"
            before.append(head + expr)
        cur = end
    before.append(line[cur:])
    after.append(line[cur:])
    return _clean("".join(before)), _clean("".join(after)), calls


def _number(s: str) -> float | None:
    s = s.strip().replace(",", "").rstrip(".")
    if s.startswith("$"):
        s = s[1:]
    try:
        v = float(s)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _matches(output: str, value: str) -> bool:
    """Does a printed number equal the annotated value (which GSM8K authors sometimes rounded)?"""
    got, want = _number(output), _number(value)
    if got is None or want is None:
        return False
    if abs(got - want) <= 1e-6 * max(1.0, abs(want)):
        return True
    v = value.strip().replace(",", "")
    decimals = len(v.split(".", 1)[1]) if "." in v else 0
    return round(got, decimals) == want or abs(got - want) <= 0.5 * 10 ** (-decimals) + 1e-9


def _steps(solution: str) -> tuple[list[dict], str]:
    body = solution.rsplit("####", 1)[0]
    lines = [ln.strip() for ln in body.strip().split("\n") if ln.strip()]
    steps, pending = [], []
    for ln in lines:
        pre, post, calls = _render_line(ln)
        if not calls:
            pending.append(pre)
            continue
        steps.append({"think": " ".join(pending + [pre]), "post": post, "calls": calls})
        pending = []
    tail = " ".join(pending)
    return steps, tail


def _merge(steps: list[dict], max_calls: int) -> list[dict]:
    """Merge consecutive steps (evenly) so that there are at most `max_calls` tool calls."""
    if len(steps) <= max_calls:
        return steps
    n, out, i = len(steps), [], 0
    for g in range(max_calls):
        size = n // max_calls + (1 if g < n % max_calls else 0)
        grp = steps[i : i + size]
        i += size
        out.append({"think": " ".join(s["think"] for s in grp), "post": " ".join(s["post"] for s in grp),
                    "calls": [c for s in grp for c in s["calls"]]})
    return out


def _gold(example: dict) -> tuple[str, str]:
    sol = example.get("solution") or example.get("answer")
    if not isinstance(sol, str) or "####" not in sol:
        raise Dropped("no_solution")
    final = sol.rsplit("####", 1)[1].strip().replace(",", "")
    if not final:
        raise Dropped("no_solution")
    return sol, final


def gsm8k_to_sft(example: dict, python_tool, *, max_calls: int = DEFAULT_MAX_CALLS,
                 max_chars: int = DEFAULT_MAX_CHARS, stats: dict | None = None) -> dict | None:
    """One GSM8K example (a raw `{question, answer}` line or an `arpo.data.datasets` example, which
    keeps the worked solution as `solution`) -> an SFT row, or None when it is dropped. The tool is
    called as `python_tool(code) -> ToolResult`. When `stats` is given, a dropped example increments
    `stats["dropped"][reason]`."""
    try:
        return _gsm8k_row(example, python_tool, max_calls, max_chars)
    except Dropped as d:
        if stats is not None:
            stats.setdefault("dropped", {})
            stats["dropped"][d.reason] = stats["dropped"].get(d.reason, 0) + 1
        return None


def _gsm8k_row(example: dict, tool, max_calls: int, max_chars: int) -> dict:
    solution, final = _gold(example)
    question = str(example.get("question", "")).strip()
    if not question:
        raise Dropped("no_question")
    steps, tail = _steps(solution)
    if not steps:
        raise Dropped("no_calculation")
    steps = _merge(steps, max(1, max_calls))
    resp, values = _Response(), []
    for st in steps:
        code = "\n".join(f"print({expr})" for expr, _ in st["calls"])
        r = tool(code)
        if not r.ok:
            raise Dropped("tool_error", r.output[-200:])
        out_lines = r.output.strip().split("\n")
        if len(out_lines) != len(st["calls"]) or not all(_matches(o, v) for o, (_, v) in zip(out_lines, st["calls"])):
            raise Dropped("output_mismatch", f"{code!r} -> {r.output!r}")
        values += out_lines
        resp.model(f"<think> {st['think']} </think>\n<python>{code}</python>")
        resp.result(r.output)
    if not any(_matches(v, final) for v in values):
        raise Dropped("final_not_computed", f"{final} not in {values}")
    conclusion = _clean(" ".join(x for x in (steps[-1]["post"], tail) if x))
    resp.model(f"<think> {conclusion} </think>\n<answer> \\boxed{{{final}}} </answer>")
    text = resp.text()
    if len(text) > max_chars:
        raise Dropped("too_long")
    return {"id": str(example.get("id", "")), "task": "math", "question": question, "answers": [final],
            "system": "math", "response": text, "tool_results": resp.spans,
            "source": str(example.get("source", "gsm8k"))}


# ---------------------------------------------------------------------------------------------
# HotpotQA


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip().lower()


def _supporting(example: dict) -> list[tuple[str, str]]:
    """[(title, supporting sentences of that page)] in the order of supporting_facts, deduplicated."""
    sf, ctx = example.get("supporting_facts") or {}, example.get("context") or {}
    titles, sent_ids = list(sf.get("title", [])), list(sf.get("sent_id", []))
    pages = dict(zip(ctx.get("title", []), ctx.get("sentences", [])))
    out: dict[str, list[str]] = {}
    for t, i in zip(titles, sent_ids):
        sents = pages.get(t)
        if sents is None:
            raise Dropped("missing_context", t)
        sent = sents[i].strip() if isinstance(i, int) and 0 <= i < len(sents) else ""
        out.setdefault(t, [])
        if sent and sent not in out[t]:
            out[t].append(sent)
    if not out:
        raise Dropped("no_supporting_facts")
    return [(t, " ".join(s)) for t, s in out.items()]


def _short(s: str, n: int = 300) -> str:
    s = re.sub(r"\s+", " ", s).strip()
    return s if len(s) <= n else s[: n - 3].rsplit(" ", 1)[0] + "..."


def hotpotqa_to_sft(example: dict, search_fn: Callable[[str], str], *, max_chars: int = 4000,
                    require_retrieved: bool = True, stats: dict | None = None) -> dict | None:
    """One raw HotpotQA line (HF layout: supporting_facts, context) -> an SFT row, or None when dropped.
    `search_fn(query) -> str` returns the search tool's output text (production:
    `build_tools(["search"], search_index=...)["search"](q).output`). With `require_retrieved`, an
    example is dropped when a supporting page's title does not appear in its search output."""
    try:
        return _hotpot_row(example, search_fn, max_chars, require_retrieved)
    except Dropped as d:
        if stats is not None:
            stats.setdefault("dropped", {})
            stats["dropped"][d.reason] = stats["dropped"].get(d.reason, 0) + 1
        return None


def _hotpot_row(example: dict, search_fn, max_chars: int, require_retrieved: bool) -> dict:
    question = str(example.get("question", "")).strip()
    answer = str(example.get("answer", "")).strip()
    if not question or not answer:
        raise Dropped("no_question_or_answer")
    facts = _supporting(example)
    resp = _Response()
    for k, (title, fact) in enumerate(facts):
        if k == 0:
            think = f"I need to find information about {title}."
        else:
            think = f"{_short(facts[k - 1][1])} Next I need to find information about {title}."
        output = search_fn(title)
        if not isinstance(output, str) or not output.strip():
            raise Dropped("empty_search_result", title)
        if output.lstrip().startswith("Error"):
            raise Dropped("search_error", output[:200])
        if require_retrieved and _norm(title) not in _norm(output):
            raise Dropped("title_not_retrieved", title)
        resp.model(f"<think> {think} </think>\n<search> {title} </search>")
        resp.result(output)
    resp.model(f"<think> {_short(facts[-1][1])} So the answer is {answer}. </think>\n"
               f"<answer> \\boxed{{{answer}}} </answer>")
    text = resp.text()
    if len(text) > max_chars:
        raise Dropped("too_long")
    return {"id": str(example.get("id", "")), "task": "qa", "question": question, "answers": [answer],
            "system": "search", "response": text, "tool_results": resp.spans,
            "source": str(example.get("source", "hotpotqa"))}


# ---------------------------------------------------------------------------------------------
# Dataset builder


def _read_jsonl(path: Path, limit: int | None) -> list[dict]:
    if not path.is_file():
        raise ArpoError(f"data file {path} does not exist")
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ArpoError(f"{path}:{i}: invalid JSON ({e.msg} at column {e.colno})") from e
            if not isinstance(row, dict):
                raise ArpoError(f"{path}:{i}: expected a JSON object, got {type(row).__name__}")
            row.setdefault("id", f"{path.parent.name or path.stem}-{path.stem}-{i}")
            row["source"] = f"{path.parent.name}/{path.name}:{i}"
            out.append(row)
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise ArpoError(f"{path}: no examples")
    return out


def build_sft_dataset(task: str, in_path: str | Path, out_path: str | Path, limit: int | None = None, *,
                      python_tool=None, search_fn: Callable[[str], str] | None = None,
                      max_calls: int = DEFAULT_MAX_CALLS, max_chars: int | None = None, workers: int = 4,
                      quiet: bool = False) -> dict:
    """Convert the first `limit` examples of `in_path` (GSM8K or HotpotQA JSONL) into SFT rows and write
    them to `out_path` atomically (a temporary file, then os.replace). `python_tool` (gsm8k; default: a
    fresh PythonTool, closed afterwards) or `search_fn` (hotpotqa; required) supply the real tool
    outputs. Returns stats: read, written, dropped {reason: count}, tool calls and lengths."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    if task not in SFT_TASKS:
        raise ArpoError(f"unknown SFT data task {task!r}; choose one of {', '.join(SFT_TASKS)}")
    if limit is not None and limit < 1:
        raise ArpoError("--limit must be >= 1")
    examples = _read_jsonl(Path(in_path), limit)
    stats: dict = {"task": task, "data": str(in_path), "out": str(out_path), "read": len(examples),
                   "written": 0, "dropped": {}}
    own_tool = False
    if task == "gsm8k":
        if python_tool is None:
            from arpo.tools.python import PythonTool

            python_tool, own_tool = PythonTool(pool_size=max(1, workers)), True
        mc = max_chars or DEFAULT_MAX_CHARS

        def convert(ex):
            return gsm8k_to_sft(ex, python_tool, max_calls=max_calls, max_chars=mc, stats=stats)
    else:
        if search_fn is None:
            raise ArpoError("hotpotqa SFT data needs a search tool (search_fn)")
        mc = max_chars or 4000

        def convert(ex):
            return hotpotqa_to_sft(ex, search_fn, max_chars=mc, stats=stats)

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    rows: list[dict] = []
    cols = [TextColumn(f"sft-data {task}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeRemainingColumn()]
    try:
        with Progress(*cols, disable=quiet) as bar, ThreadPoolExecutor(max(1, workers)) as pool:
            t = bar.add_task("convert", total=len(examples), info="")
            # map keeps the input order; stats["dropped"] is only touched by dict ops under the GIL
            for row in pool.map(convert, examples):
                if row is not None:
                    rows.append(row)
                bar.update(t, advance=1, info=f"kept {len(rows)}")
        with open(tmp, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
        if own_tool:
            python_tool.close()
    _summarize(stats, rows)
    return stats


def _summarize(stats: dict, rows: Iterable[dict]) -> None:
    rows = list(rows)
    stats["written"] = len(rows)
    stats["dropped"] = dict(sorted(stats["dropped"].items()))
    stats["dropped_total"] = sum(stats["dropped"].values())
    if rows:
        calls = [len(r["tool_results"]) for r in rows]
        lens = [len(r["response"]) for r in rows]
        stats["tool_calls_mean"] = round(sum(calls) / len(rows), 3)
        stats["tool_calls_max"] = max(calls)
        stats["response_chars_mean"] = round(sum(lens) / len(rows), 1)
        stats["response_chars_max"] = max(lens)
