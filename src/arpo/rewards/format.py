"""The format check of the hierarchical reward (spec §5.1). A failure costs reward −1.

Rules, on the decoded response:
  * at least one <think>…</think>, and every <think> closed before the next opens;
  * exactly one <answer>…</answer>, and it contains \\boxed{…};
  * each <search>/<python> call is closed by its own tag and then followed by a <result>…</result>
    block, in order, before the next call or the answer;
  * nothing but whitespace after </answer> (the end-of-turn token is not text).
"""

from __future__ import annotations

import re

TOOL_TAGS = ("search", "python")
_TAG = re.compile(r"<(/?)(think|answer|result|search|python)>")


def check_format(response: str, tools: tuple[str, ...] = TOOL_TAGS) -> str | None:
    """None when the response follows the protocol, else a short reason."""
    tags = [(m.group(1) == "/", m.group(2), m.start(), m.end()) for m in _TAG.finditer(response)]
    opens = {t: sum(1 for c, n, *_ in tags if n == t and not c) for t in ("think", "answer", "result")}
    if opens["think"] == 0:
        return "no <think> block"
    if opens["answer"] != 1 or sum(1 for c, n, *_ in tags if n == "answer" and c) != 1:
        return f"expected exactly one <answer>…</answer>, found {opens['answer']}"
    state = None  # the open tag we are inside: think | answer | result | a tool
    expect_result = None  # a tool call just closed: its <result> must come next
    n_call = 0
    answer_span = None
    for closing, name, s, e in tags:
        if state is None:
            if closing:
                return f"</{name}> without an opening <{name}>"
            if expect_result is not None and name != "result":
                return f"<{expect_result}> call #{n_call} not followed by <result>"
            if name in TOOL_TAGS and name not in tools:
                return f"<{name}> is not an available tool"
            if name == "result" and expect_result is None:
                return "<result> that does not follow a tool call"
            if name in TOOL_TAGS:
                n_call += 1
            if name == "answer":
                answer_span = [e, None]
            state = name
            continue
        if not closing:
            if state == "result" or (state in TOOL_TAGS and name != state):
                continue  # tags inside tool text (code strings, passages) are data
            return f"<{name}> opened inside <{state}>"
        if name != state:
            if state in TOOL_TAGS + ("result",):
                continue
            return f"</{name}> closes <{state}>"
        if name in TOOL_TAGS:
            expect_result = name
        elif name == "result":
            expect_result = None
        elif name == "answer":
            answer_span[1] = s
            if response[e:].strip():
                return "text after </answer>"
        state = None
    if state is not None:
        return f"unclosed <{state}>"
    if expect_result is not None:
        return f"<{expect_result}> call #{n_call} not followed by <result>"
    if answer_span is None or answer_span[1] is None:
        return "no closed <answer>"
    if "\\boxed" not in response[answer_span[0] : answer_span[1]]:
        return "answer has no \\boxed{}"
    return None
