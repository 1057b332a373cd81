"""SFT rows: the format `arpo sft-data` writes and `arpo sft` trains on, built, read, tokenized and written.

Row: {id, task, question, answers, system, response, tool_results: [[start, end], ...], source};
`tool_results` are the character spans of the environment-inserted result blocks, which the SFT loss
masks out (recipes/sft.py); rows of `arpo sft-data tools` also hold `tool_text`, the spans of the
tools' own text inside them (tokenized with special tokens split, as the rollout does), and rows with
their own `system_prompt` (and `tools`, `tool_format`) are prompted with it.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from arpo.data.prompts import TASK_TOOLS, render_prompt, system_prompt
from arpo.errors import ArpoError
from arpo.jsonl import iter_jsonl, write_jsonl
from arpo.rollout.tool_formats import SchemaTools
from arpo.rollout.tool_tokens import encode_pieces
from arpo.tools.base import RESULT_CLOSE, RESULT_OPEN
from arpo.training.progress import Bar


def result_spans(response: str) -> list[tuple[int, int]]:
    """Character spans of the "\\n<result>\\n…\\n</result>\\n" blocks format_result inserts."""
    spans: list[tuple[int, int]] = []
    pos = 0
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


def assemble(parts: list[tuple[str, str]], tool_text: list | None = None) -> tuple[str, list[list[int]]]:
    """parts: (text, kind) with kind 'model', 'result' (the environment's markup) or 'tool' (a tool's
    own text, inside a result block) -> (response, result spans: adjacent non-model parts are one
    block). The spans of the 'tool' parts are appended to `tool_text` when given."""
    out = ""
    spans: list[list[int]] = []
    for text, kind in parts:
        if kind != "model":
            if spans and spans[-1][1] == len(out) and out:
                spans[-1][1] += len(text)
            else:
                spans.append([len(out), len(out) + len(text)])
            if kind == "tool" and tool_text is not None:
                tool_text.append([len(out), len(out) + len(text)])
        out += text
    return out, spans


def read_sft_rows(paths: list[str], limit: int | None = None) -> list[dict]:
    rows = []
    for path in paths:
        if not Path(path).is_file():
            raise ArpoError(f"SFT data file {path} does not exist (write one with `arpo sft-data`)")
        for where, row in iter_jsonl(path, "SFT data file"):
            for key in ("question", "response"):
                if not isinstance(row.get(key), str) or not row[key]:
                    raise ArpoError(f"{where}: field {key!r} is missing or not a non-empty string")
            spans = row.get("tool_results", [])
            if not isinstance(spans, list) or not all(
                isinstance(s, list) and len(s) == 2 and 0 <= s[0] <= s[1] <= len(row["response"]) for s in spans
            ):
                raise ArpoError(f"{where}: field 'tool_results' must be a list of [start, end] spans in 'response'")
            inner = row.get("tool_text", [])
            if not isinstance(inner, list) or not all(
                isinstance(t, list) and len(t) == 2 and any(s[0] <= t[0] <= t[1] <= s[1] for s in spans) for t in inner
            ):
                raise ArpoError(f"{where}: field 'tool_text' must be a list of [start, end] spans inside "
                                "'tool_results'")
            row["_where"] = where
            rows.append(row)
            if limit is not None and len(rows) >= limit:
                return rows
    if not rows:
        raise ArpoError(f"no SFT rows in {', '.join(paths)}")
    return rows


def tokenize_row(tok, row: dict) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, response ids, loss mask). The response is tokenized piece by piece — model
    text, then each result block — as the rollout engine sees it (results are appended as their
    own tokens after generation pauses at a closing tool tag)."""
    if isinstance(row.get("system_prompt"), str):  # rows of `arpo sft-data tools`: the prompt the rollout uses
        prompt = render_prompt(tok, row["question"], row["system_prompt"], tools=SchemaTools(row.get("tools", [])),
                               tool_format=row.get("tool_format", "tags"))
    else:
        template = row.get("system") or ("search" if row.get("task") == "qa" else "math")
        if template not in TASK_TOOLS:
            raise ArpoError(f"{row.get('_where', '?')}: field 'system' is {template!r}; expected one of "
                            f"{sorted(TASK_TOOLS)}")
        prompt = render_prompt(tok, row["question"], system_prompt(template, list(TASK_TOOLS[template])))
    text = row["response"]
    ids, mask, cur = [], [], 0
    for s, e in sorted(map(tuple, row.get("tool_results", []))):
        if text[cur:s]:
            t = tok.encode(text[cur:s], add_special_tokens=False)
            ids += t
            mask += [1] * len(t)
        t = encode_pieces(tok, _result_pieces(row, text, s, e))
        ids += t
        mask += [0] * len(t)
        cur = e
    if text[cur:]:
        t = tok.encode(text[cur:], add_special_tokens=False)
        ids += t
        mask += [1] * len(t)
    ids.append(tok.eos_token_id)
    mask.append(1)
    return prompt, ids, mask


def _result_pieces(row: dict, text: str, s: int, e: int) -> list[tuple[str, bool]]:
    """The environment's block text[s:e] as rollout/tool_tokens.py pieces (text, from_tool), tokenized as the
    rollout does: `tool_text` spans (the tools' own text, json rows) plain and the template markup
    around them with real special tokens; a tag-format block is all tool text. A json row without
    `tool_text` (written before it existed) keeps its markup, so its tool text is not split either."""
    inner = sorted((a, b) for a, b in map(tuple, row.get("tool_text", [])) if s <= a <= b <= e)
    if not inner:
        return [(text[s:e], row.get("tool_format", "tags") != "json")]
    pieces, cur = [], s
    for a, b in inner:
        pieces += [(text[cur:a], False), (text[a:b], True)]
        cur = b
    return pieces + [(text[cur:e], False)]


def convert_rows(items, convert, limit: int | None, progress: bool, label: str) -> tuple[list[dict], Counter]:
    """Convert items until `limit` rows check out: (rows, Counter of reasons, "ok" included). Ctrl-C
    stops it with the rows made so far (reasons[INTERRUPTED] = 1): they were thrown away."""
    reasons: Counter = Counter()
    rows = []
    with Bar(enabled=progress) as bar:
        t = bar.add_task(label, total=limit or len(items))
        try:
            for item in items:
                row, why = convert(item)
                reasons[why] += 1
                if row is not None:
                    rows.append(row)
                    bar.advance(t)
                if limit is not None and len(rows) >= limit:
                    break
        except KeyboardInterrupt:
            reasons[INTERRUPTED] = 1
            print(f"{label}: interrupted; the {len(rows)} rows made are kept", file=sys.stderr, flush=True)
    return rows, reasons


INTERRUPTED = "interrupted (Ctrl-C)"  # convert_rows' mark in its reasons


def write_rows(out_path, rows: list, reasons: Counter):
    """Write the SFT rows; none at all is an error that says why each input row was dropped (a file of
    0 rows used to be written with exit 0, e.g. `sft-data gsm8k` on SVAMP rows)."""
    if not rows:
        why = ", ".join(f"{k}: {v}" for k, v in reasons.most_common() if k != "ok") or "no input rows"
        raise ArpoError(f"no SFT row checked out, nothing written to {out_path} ({why}); is the source right "
                        "for this data (gsm8k needs GSM8K '<<expr=value>>' solutions, svamp an 'equation', hotpotqa "
                        "supporting facts)?")
    return write_jsonl(out_path, rows)


def row_stats(rows: list, reasons: Counter, out) -> dict:
    stopped = INTERRUPTED in reasons
    return {"written": len(rows), "read": sum(v for k, v in reasons.items() if k != INTERRUPTED),
            "dropped": {k: v for k, v in reasons.items() if k not in ("ok", INTERRUPTED)}, "out": str(out),
            **({"interrupted": True} if stopped else {})}
