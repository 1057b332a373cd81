"""The format check of the hierarchical reward (spec §5.1). A failure costs reward −1.

Rules, on the decoded response (protocol of spec §1):
  * at least one <think>…</think>; every <think> is closed before any other tag opens;
  * exactly one <answer>…</answer>, holding no other tag, and it contains \\boxed{…} (or `\\boxed 5`);
  * each tool call <search>/<python> (or any tag in `tools`) is closed by its own tag and the next
    tag after it is <result>…</result>; a <result> only ever follows a call. Tags inside a call or a
    result are data (code strings, retrieved passages), not protocol;
  * after </answer> only whitespace and special-token text (`<|im_end|>`, `<|endoftext|>`, `</s>`,
    `<eos>`, `<end_of_turn>`) may follow: the tokenizer decodes EOS as text, but a model that keeps
    writing after its answer (generation normally stops at </answer>) breaks the format.

Calls are numbered over the whole response ("<python> call #2" is the second call of any tool).

`tool_spans` ([start, end) character spans of the blocks the environment appended — a rollout knows
them from its loss mask: `Trajectory.tool_spans`) make the check read tags only from the model's own
text: a tool whose output holds `</result><answer>…` cannot close its result or answer for the
model. Each such block stands for the `<result>` a call awaits (or, in the json format, for the
template's tool turn, which no call tag awaits). Without spans the decoded text is all there is and
tags inside results are found by the text alone.
"""

from __future__ import annotations

import re

from arpo.rewards.answer import extract_boxed

TOOL_TAGS = ("search", "python")
_CORE = ("think", "answer", "result")
_TRAILER = re.compile(r"(?:\s|<\|[^<>|]*\|>|</s>|<eos>|<end_of_turn>)*")


def _tag_re(tools: tuple[str, ...]) -> re.Pattern:
    names = dict.fromkeys(_CORE + TOOL_TAGS + tuple(tools))
    return re.compile(r"<(/?)(" + "|".join(map(re.escape, names)) + r")>")


def model_text(response: str, tool_spans=None) -> str:
    """The response with every environment-appended block (tool_spans) replaced by a newline: the text
    the model wrote, for reading answers and tags from it. No spans: the response unchanged."""
    if not tool_spans:
        return response
    out, pos = [], 0
    for a, b in sorted((int(a), int(b)) for a, b in tool_spans):
        if a >= pos:
            out += [response[pos:a], "\n"]
            pos = b
    return "".join(out) + response[pos:]


_ENV = "env"  # an environment-appended block in the tag stream


def _events(response: str, tools: tuple[str, ...], tool_spans) -> list[tuple[bool, str, int, int]]:
    """(closing, tag name, start, end) of the protocol tags in the model's own text, in order, with
    (False, "env", a, b) for each appended block."""
    rx, out, pos = _tag_re(tools), [], 0
    for a, b in sorted((int(a), int(b)) for a, b in (tool_spans or ())):
        if a < pos:
            continue
        out += [(m.group(1) == "/", m.group(2), m.start(), m.end()) for m in rx.finditer(response, pos, a)]
        out.append((False, _ENV, a, b))
        pos = b
    return out + [(m.group(1) == "/", m.group(2), m.start(), m.end()) for m in rx.finditer(response, pos)]


def _scan(response: str, tools: tuple[str, ...], tool_spans=None) -> tuple[str | None, list[str]]:  # noqa: C901 - a one-pass tag scanner: a branch per tag kind and state
    """(first protocol error or None, tool tags of the top-level calls in order)."""
    calls: list[str] = []
    state: str | None = None  # the tag we are inside
    pending: str | None = None  # a call just closed: its <result> must be the next tag
    n_think = n_answer = 0
    answer_text: str | None = None
    answer_start = answer_end = 0
    opaque = dict.fromkeys(tools + TOOL_TAGS + ("result",))  # their bodies are data
    for closing, name, start, end in _events(response, tools, tool_spans):
        if name == _ENV:  # the environment's block: the awaited result, or a json tool turn
            if state is not None:
                return f"a tool result inside unclosed <{state}> (unbalanced <{state}>)", calls
            if answer_end:
                return "text after </answer>: a tool result", calls
            pending = None
            continue
        if state in opaque:  # inside a call or a result only its own closing tag counts
            if closing and name == state:
                pending = state if state != "result" else None
                state = None
            continue
        if state is not None:  # inside <think> or <answer>
            if closing and name == state:
                if name == "answer":
                    answer_text, answer_end = response[answer_start:start], end
                state = None
                continue
            what = f"</{name}>" if closing else f"<{name}>"
            return f"{what} inside unclosed <{state}> (unbalanced <{state}>)", calls
        if closing:
            return f"</{name}> without an opening <{name}> (unbalanced <{name}>)", calls
        if answer_end and name != "answer":
            return f"text after </answer>: <{name}>", calls
        if pending is not None and name != "result":
            return f"<{pending}> call #{len(calls)} not followed by <result>", calls
        if name == "result" and pending is None:
            return "<result> that does not follow a tool call", calls
        if name in TOOL_TAGS and name not in tools:
            return f"<{name}> is not an available tool", calls
        if name not in _CORE:
            calls.append(name)
        n_think += name == "think"
        if name == "answer":
            n_answer += 1
            answer_start = end
        state = name
    if state is not None:
        return f"unclosed <{state}> (unbalanced <{state}>)", calls
    if pending is not None:
        return f"<{pending}> call #{len(calls)} not followed by <result>", calls
    if n_think == 0:
        return "no <think> block", calls
    if n_answer != 1:
        return f"expected exactly one <answer>, found {n_answer}", calls
    if _TRAILER.fullmatch(response, answer_end) is None:
        tail = response[answer_end:].strip()
        return f"text after </answer>: {tail[:30]!r}", calls
    if extract_boxed(answer_text) is None:
        return "answer has no \\boxed{}", calls
    return None, calls


def check_format(response: str, tools: tuple[str, ...] = TOOL_TAGS, tool_spans=None) -> str | None:
    """None when the response follows the protocol (spec §5.1), else a short human reason.
    tool_spans: the environment's blocks (read as data, never as tags)."""
    return _scan(response, tuple(tools), tool_spans)[0]


def tool_calls_in(response: str, tools: tuple[str, ...] = TOOL_TAGS, tool_spans=None) -> list[str]:
    """Tags of the top-level tool calls, in order (tags quoted inside code or results are not calls)."""
    return _scan(response, tuple(tools), tool_spans)[1]
