"""How the agent writes tool calls and receives results — two formats, chosen per run
(`agent.tool_format`):

* `tags` (the paper's, the default): `<name>input</name>`; the environment appends
  `\\n<result>\\n...\\n</result>\\n`. Generation pauses at any tool's closing tag.
* `json` (the model's native function calling, hermes style as Qwen2.5/Qwen3 use): the tools'
  JSON schemas go to the chat template (`apply_chat_template(tools=...)`), the model writes
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (several per turn allowed) and ends its
  turn; the results come back as `tool` messages rendered by the template, followed by the next
  assistant header. Generation pauses at the end-of-turn token. For a template without tool
  support (SmolLM2's ChatML) arpo renders the hermes convention itself: the tools in the system
  prompt, each result as `<tool_response>...</tool_response>` in a user turn.

In both formats everything after the prompt is built in token space: the ids trained on are the
ids sampled plus the ids of the appended text (results and template tokens, loss mask 0) — the
conversation is never re-tokenized. `render_results` returns what to append as pieces
`(text, from_tool)` (rollout/tool_tokens.py): the tools' own text is encoded with special tokens split, so a
tool that prints `<|im_end|>` cannot end a turn; only the environment's markup keeps real special
tokens. The tag format's whole `<result>` block is tool text (it holds no template markup). The
json format gets its block from the chat template by rendering the conversation without and with
the tool messages and keeping the difference (checked to be a pure extension); the tool messages
are rendered with placeholders that are then replaced by the outputs, so the template's markers and
the tools' text stay apart (a template that transforms a message's content, e.g. `| trim`, sees the
placeholder: the output goes in as the tool wrote it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal, overload

# how tools are described to the model lives with the prompts (data layer); re-exported here
from arpo.data.prompts import HERMES_TOOLS as HERMES_TOOLS
from arpo.data.prompts import hermes_system_block as hermes_system_block
from arpo.data.prompts import template_supports_tools as template_supports_tools
from arpo.data.prompts import tool_schema as tool_schema
from arpo.errors import ArpoError
from arpo.rollout.tool_tokens import Pieces
from arpo.tools.base import ToolCall, format_result
from arpo.tools.registry import ToolRegistry

FORMATS = ("tags", "json")
TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass
class TagFormat:
    name: str = "tags"
    result_template: str | None = None  # "{output}" the result; None: format_result's (spec §1)

    def stop_strings(self, tools: ToolRegistry) -> list[str]:
        return tools.stop_strings()

    def pause_token_ids(self, tokenizer) -> tuple[int, ...]:
        return ()

    def parse(self, segment: str, tools: ToolRegistry, stop_text: str | None) -> list[ToolCall] | None:
        call = tools.parse_last_call(segment)
        return None if call is None else [call]

    def render_results(self, tokenizer, turn_text: str, calls: list[ToolCall], outputs: list[str]) -> Pieces:
        """The `<result>` blocks (or the template's result format): all tool text (no special token of
        the template belongs in them)."""
        if self.result_template is not None:
            return [("".join(self.result_template.replace("{output}", o) for o in outputs), True)]
        return [("".join(format_result(o) for o in outputs), True)]


@dataclass
class JsonFormat:
    name: str = "json"

    def stop_strings(self, tools: ToolRegistry) -> list[str]:
        return [f"</{t}>" for t in ("answer",)]  # an answer ends the trajectory as in the tag format

    def pause_token_ids(self, tokenizer) -> tuple[int, ...]:
        """The end-of-turn token pauses (the loop then runs the turn's calls or finishes)."""
        ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        for t in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
            i = tokenizer.convert_tokens_to_ids(t) if t in tokenizer.get_vocab() else None
            if i is not None:
                ids.add(i)
        return tuple(sorted(ids))

    def parse(self, segment: str, tools: ToolRegistry, stop_text: str | None) -> list[ToolCall] | None:
        """The turn's calls; None when the turn holds none (a final answer)."""
        out = []
        for body in TOOL_CALL_RE.findall(segment):
            out.append(parse_hermes(body, tools))
        tail = segment[segment.rfind("</tool_call>") + 12:] if "</tool_call>" in segment else segment
        if "<tool_call>" in tail:  # an opened call the turn never closed
            out.append(ToolCall("tool_call", "", error="Error: <tool_call> without </tool_call>; write "
                                "<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>"))
        return out or None

    def render_results(self, tokenizer, turn_text: str, calls: list[ToolCall], outputs: list[str]) -> Pieces:
        """What follows the turn's end-of-turn token: the tool messages and the next assistant header,
        as pieces — the template's markup (real special tokens) and each output (plain text)."""
        marks = [PLACEHOLDER.format(i) for i in range(len(outputs))]
        if template_supports_tools(tokenizer):
            tool_msgs = [{"role": "tool", "name": c.tag, "content": m} for c, m in zip(calls, marks, strict=True)]
            pieces = fill_placeholders(_template_delta(tokenizer, turn_text, tool_msgs), marks, outputs)
            if pieces is not None:
                return pieces
        resp = "\n".join(f"<tool_response>\n{m}\n</tool_response>" for m in marks)
        pieces = fill_placeholders(_template_delta(tokenizer, turn_text, [{"role": "user", "content": resp}]), marks,
                                   outputs)
        if pieces is None:  # a template we cannot extend: ChatML, the hermes convention's home
            pieces = fill_placeholders(f"\n<|im_start|>user\n{resp}<|im_end|>\n<|im_start|>assistant\n", marks, outputs)
            assert pieces is not None  # the ChatML text holds each mark once, in order
        return pieces


# where a tool's output goes in a rendering (private-use characters: no template escapes them)
PLACEHOLDER = "\ue000arpo-tool-output-{}\ue001"


@overload
def fill_placeholders(rendered: str, marks: list[str], outputs: list[str], strict: Literal[False]) -> Pieces: ...


@overload
def fill_placeholders(rendered: str | None, marks: list[str], outputs: list[str],
                      strict: bool = True) -> Pieces | None: ...


def fill_placeholders(rendered: str | None, marks: list[str], outputs: list[str], strict: bool = True) -> Pieces | None:
    """Split a rendering at its placeholders into markup pieces (text, False) and the outputs
    (text, True). strict: each placeholder exactly once, in order, else None (the template dropped,
    repeated or reordered one); not strict: wherever they are."""
    if rendered is None:
        return None
    if strict and any(rendered.count(m) != 1 for m in marks):
        return None
    by_mark = dict(zip(marks, outputs, strict=True))
    pieces: Pieces = []
    pos = 0
    order = []
    for m in re.finditer("|".join(map(re.escape, marks)), rendered) if marks else ():
        pieces += [(rendered[pos:m.start()], False), (by_mark[m.group(0)], True)]
        order.append(m.group(0))
        pos = m.end()
    if strict and order != marks:
        return None
    pieces.append((rendered[pos:], False))
    return [p for p in pieces if p[0]]


def _template_delta(tokenizer, turn_text: str, new_msgs: list[dict]) -> str | None:
    """Render [system, user, assistant(turn)] without and with `new_msgs` (+ generation prompt);
    the difference after the turn's end-of-turn token, or None when the second is not an extension."""
    base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": turn_text}]
    try:
        before = tokenizer.apply_chat_template(base, tokenize=False)
        after = tokenizer.apply_chat_template(base + new_msgs, tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that rejects the shape (e.g. no system role)
        return None
    end = _turn_end(tokenizer, before, turn_text)
    if end is None or not after.startswith(before[:end]):
        return None
    return after[end:]


def _turn_end(tokenizer, rendered: str, turn_text: str) -> int | None:
    """Where the sampled stream stops in a rendering: after the turn's text and its end-of-turn token."""
    at = rendered.rfind(turn_text)
    if at < 0:
        return None
    pos = at + len(turn_text)
    eos = tokenizer.eos_token or ""
    for marker in (eos, "<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
        if marker and rendered.startswith(marker, pos):
            return pos + len(marker)
    return None


def parse_hermes(body: str, tools: ToolRegistry) -> ToolCall:
    """One `<tool_call>` body -> ToolCall with `arguments` (or an error saying what was wrong)."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall("tool_call", body, error=f"Error: the tool call is not valid JSON ({e.msg} at column "
                        f"{e.colno}); write {{\"name\": ..., \"arguments\": {{...}}}}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall("tool_call", body,
                        error="Error: a tool call needs a string \"name\" and an \"arguments\" object")
    name, args = obj["name"], obj.get("arguments", {})
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    if name not in tools:
        known = ", ".join(tools.names) or "none"
        return ToolCall(name, body, error=f"Error: unknown tool {name!r}. Available tools: {known}.")
    if not isinstance(args, dict):
        return ToolCall(name, body, error=f"Error: the arguments of {name} must be a JSON object")
    return ToolCall(name, json.dumps(args, ensure_ascii=False), arguments=args)


class SchemaTools:
    """Tools known only by their schemas (an SFT row's `tools`): enough to render a prompt."""

    def __init__(self, schemas: list[dict]):
        self._by = {s["function"]["name"]: type("T", (), {"schema": s, "name": s["function"]["name"]})()
                    for s in schemas}
        self.names = list(self._by)

    def __getitem__(self, name):
        return self._by[name]

    def __contains__(self, name) -> bool:
        return name in self._by


def get_format(name: str):
    if name == "tags":
        return TagFormat()
    if name == "json":
        return JsonFormat()

    raise ArpoError(f"agent.tool_format: {name!r}; choose tags or json")
