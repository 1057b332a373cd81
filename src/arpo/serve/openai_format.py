"""The OpenAI Chat Completions format of `arpo serve agent`: requests in, responses and stream chunks
out, errors as `{"error": {message, type, param, code}}`. Pure functions and pydantic models; the HTTP
routes are in serve/app.py.

What a client sees (the agent runs its tools itself, on the server):

* `choices[i].message.content`: the agent's final turn, i.e. the text it wrote after its last tool
  result (its `<think>` and `<answer>` tags included, as the model wrote them).
* `choices[i].message.agent_messages` (extra field; openai client: `message.model_extra["agent_messages"]`):
  the turns before it in OpenAI chat format: per pause of the agent, an assistant message (`content`:
  the text the model wrote, its calls included; `tool_calls`: the calls as OpenAI `{id, type:
  "function", function: {name, arguments}}`, see openai_tool_call), then a `tool` message per call
  (`tool_call_id`, `name`, `content`: the result, `ok`: false for an error result). `message.tool_calls`
  stays empty on purpose: those calls have already run, and a client must not run them again.
* `choices[i].finish_reason`: `stop` (answered, end of turn or a `stop` string) or `length` (token
  budget or tool-call cap); `choices[i].agent_finish_reason` (extra) is the agent's own reason:
  answer | eos | stop | length | tool_cap.
* `usage`: `completion_tokens` counts what the model generated; `tool_result_tokens` (extra) the
  tool results appended to its context (both count against `max_tokens`).

Sending `agent_messages` and the final message back as history reproduces the text the model saw
(chat_turns: `<result>` blocks in the tag format, tool messages in the json format).
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from arpo.engine.base import check_prompt_fits
from arpo.errors import ArpoError
from arpo.rollout.agent import ToolCallRecord, Trajectory
from arpo.rollout.tool_formats import (
    PLACEHOLDER,
    fill_placeholders,
    hermes_system_block,
    template_supports_tools,
    tool_schema,
)
from arpo.rollout.tool_tokens import encode_pieces
from arpo.tools.base import format_result

MAX_N = 16  # choices per request
MAX_STOP = 4  # stop strings per request (OpenAI's limit)
FINISH = {"answer": "stop", "eos": "stop", "stop": "stop", "length": "length", "tool_cap": "length"}
ANSWER_OPEN = "<answer>"


class ApiError(Exception):
    """An error answered in OpenAI's format."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# ---- requests ---------------------------------------------------------------------------------------
class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str = "{}"


class MessageToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: str = "function"
    function: ToolCallFunction


class Message(BaseModel):
    # extra fields (a returned message's `agent_messages`, `refusal`, `ok`, ...) are accepted and ignored
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_given(self):
        """`content: null` only on an assistant message that made tool calls (OpenAI's rule): a user
        message without content was answered 200, the model prompted with nothing."""
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs a 'content' (null only on an assistant message "
                             "with tool_calls)")
        return self


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatRequest(BaseModel):
    """POST /v1/chat/completions. Unknown fields are rejected (400); OpenAI fields that an agent with its
    own tools cannot honour are accepted only at their neutral value (see UNSUPPORTED)."""

    model_config = ConfigDict(extra="forbid")
    model: str
    messages: list[Message] = Field(..., min_length=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1,
                                 description="extension: sample from the k most likely tokens (0 or -1: off)")
    max_tokens: int | None = Field(None, ge=1, description="response budget, tool results included")
    max_completion_tokens: int | None = Field(None, ge=1, description="same as max_tokens")
    seed: int | None = Field(None, description="choice i samples with seed + i")
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # accepted, without effect
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    # accepted only at their neutral value
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None


# field -> why it cannot be honoured (accepted when None / 0 / false / empty / "auto" / "none" / text)
UNSUPPORTED = {
    "presence_penalty": "penalties are not supported",
    "frequency_penalty": "penalties are not supported",
    "logit_bias": "logit_bias is not supported",
    "logprobs": "logprobs are not returned",
    "top_logprobs": "logprobs are not returned",
    "tools": "the agent runs its own tools on the server (see GET /v1/models); client-side tools are not supported",
    "tool_choice": "the agent runs its own tools on the server; tool_choice is not supported",
    "functions": "the agent runs its own tools on the server; functions are not supported",
    "function_call": "the agent runs its own tools on the server; function_call is not supported",
    "response_format": "only text responses are supported",
}


def _neutral(value) -> bool:
    return value in (None, False, 0, "auto", "none") or value in ({}, [], {"type": "text"})


def check_request(req: ChatRequest) -> None:
    """Reject what the server cannot honour, naming the parameter."""
    for name, why in UNSUPPORTED.items():
        value = getattr(req, name)
        if not _neutral(value):
            raise ApiError(400, f"{name}: {why}", param=name, code="unsupported_parameter")
    stops = stop_strings(req)
    if len(stops) > MAX_STOP or any(not s for s in stops):
        raise ApiError(400, f"stop: up to {MAX_STOP} non-empty strings", param="stop")
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options: only allowed with stream=true", param="stream_options")
    if (req.max_tokens is not None and req.max_completion_tokens is not None
            and req.max_tokens != req.max_completion_tokens):
        raise ApiError(400, "max_tokens and max_completion_tokens differ; give one", param="max_completion_tokens")


MAX_CHARS_PER_TOKEN = 32  # a prompt longer than this many characters per context token cannot fit


def check_prompt_chars(req: ChatRequest, context_len: int) -> None:
    """Refuse, before tokenizing, messages that cannot fit the context: more than MAX_CHARS_PER_TOKEN
    characters (of their JSON) per context token. Tokenizing is the costly step (10 MB: 11.6 s)."""
    chars = sum(len(m.model_dump_json()) for m in req.messages)
    if chars > MAX_CHARS_PER_TOKEN * context_len:
        raise ApiError(400, f"the messages have {chars} characters: more than this model's context of {context_len} "
                       f"tokens can hold (at most {MAX_CHARS_PER_TOKEN} characters a token)", param="messages",
                       code="context_length_exceeded")


def stop_strings(req: ChatRequest) -> tuple[str, ...]:
    return () if req.stop is None else (req.stop,) if isinstance(req.stop, str) else tuple(req.stop)


def response_budget(req: ChatRequest, prompt_len: int, context_len: int, default: int) -> int:
    """max_tokens of the request, or the server default clipped to what the context has left."""
    try:
        left = check_prompt_fits(prompt_len, context_len)
    except ArpoError as e:
        raise ApiError(400, str(e), param="messages", code="context_length_exceeded") from None
    asked = req.max_tokens or req.max_completion_tokens
    if asked is None:
        return min(default, left)
    if asked > left:
        raise ApiError(400, f"max_tokens={asked} plus the prompt's {prompt_len} tokens exceed this model's context "
                       f"of {context_len} tokens; ask for at most {left}",
                       param="max_tokens" if req.max_tokens else "max_completion_tokens",
                       code="context_length_exceeded")
    return asked


# ---- messages -> prompt -------------------------------------------------------------------------------
def _text(m: Message, i: int) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    parts = []
    for p in m.content:
        if p.type != "text" or p.text is None:
            raise ApiError(400, f"messages[{i}].content: only text parts are supported, got {p.type!r}",
                           param=f"messages[{i}].content")
        parts.append(p.text)
    return "".join(parts)


def chat_turns(messages: list[Message], system: str, tool_format: str = "tags",
               template_tools: bool = False) -> list[dict]:
    """The conversation as chat-template messages: the agent's system prompt (the client's system and
    developer messages appended to it), then the turns as the model wrote and read them. Tag format:
    the agent's tool calls and their results (assistant + tool messages) are one assistant turn with
    `<result>` blocks. json format: each assistant turn ends where the model ended it, and the results
    follow as `tool` messages (`template_tools`: the chat template renders tools) or as one user turn
    of `<tool_response>` blocks (arpo's hermes convention otherwise; rollout/tool_formats.py)."""
    sys_parts, turns = [system], []
    tool_open = False  # the last turn made tool calls, so tool messages may follow
    for i, m in enumerate(messages):
        text = _text(m, i)
        if m.role in ("system", "developer"):
            sys_parts.append(text)
        elif m.role == "user":
            turns.append({"role": "user", "content": text})
            tool_open = False
        elif m.role == "assistant":
            written = "<tool_call>" in text if tool_format == "json" else False
            for tc in m.tool_calls or ():
                if not (written or f"</{tc.function.name}>" in text):  # a client-made message: add the call
                    text += call_text(tc.function.name, tc.function.arguments, tool_format)
            if tool_open and tool_format == "tags":
                turns[-1]["content"] += text
            else:
                turns.append({"role": "assistant", "content": text})
            tool_open = bool(m.tool_calls)
        else:  # tool
            if not tool_open:
                raise ApiError(400, f"messages[{i}]: a tool message must follow an assistant message with tool_calls",
                               param=f"messages[{i}]")
            if tool_format == "tags":
                turns[-1]["content"] += format_result(text)
            elif template_tools:
                turns.append({"role": "tool", "name": m.name or "", "content": text})
            elif turns[-1]["role"] == "user":  # the hermes convention: one user turn of responses
                turns[-1]["content"] += f"\n<tool_response>\n{text}\n</tool_response>"
            else:
                turns.append({"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"})
    last = next((m.role for m in reversed(messages) if m.role not in ("system", "developer")), None)
    if last != "user":
        raise ApiError(400, "the last message must be a user message (the agent answers it)", param="messages")
    return [{"role": "system", "content": "\n\n".join(p for p in sys_parts if p)}] + turns


def render_messages(tokenizer, messages: list[Message], system: str, tools=None,
                    tool_format: str = "tags") -> list[int]:
    """Prompt token ids: the chat template over chat_turns(...) with the assistant header. For one user
    message this is exactly data.prompts.render_prompt (what `arpo chat` and eval feed the model): in
    the json format the tools' schemas go to the template, or the hermes block to the system prompt.
    Tool messages' text is encoded as plain text (special-token strings in it split), as the rollout
    encodes the results it appends."""
    template_tools = template_supports_tools(tokenizer)
    # the tool messages' text goes in as plain tokens (rollout/tool_tokens.py): rendered as placeholders,
    # then encoded with special tokens split, so a tool's `<|im_end|>` cannot end a turn
    outputs = [_text(m, i) for i, m in enumerate(messages) if m.role == "tool"]
    marks = [PLACEHOLDER.format(k) for k in range(len(outputs))]
    marked = iter(marks)
    messages = [m.model_copy(update={"content": next(marked)}) if m.role == "tool" else m for m in messages]
    turns = chat_turns(messages, system, tool_format, template_tools)
    kw = {}
    if tool_format == "json" and tools is not None and len(tools.names):
        if template_tools:
            kw["tools"] = [tool_schema(tools[n]) for n in tools.names]
        else:
            turns[0]["content"] += "\n\n" + hermes_system_block(tools)
    if outputs:
        text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True, **kw)
        return encode_pieces(tokenizer, fill_placeholders(text, marks, outputs, strict=False))
    out = tokenizer.apply_chat_template(turns, tokenize=True, add_generation_prompt=True, **kw)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


# ---- the agent's tool calls <-> OpenAI tool_calls ---------------------------------------------------
def openai_tool_call(call: ToolCallRecord, call_id: str) -> dict:
    """One recorded tool call as an OpenAI `tool_calls` entry: its parsed arguments (json format, and
    tools whose tag body is a JSON object), else the tag's body as the one argument `input` — the
    schema arpo gives a tag-only tool (tools/formats.tool_schema). call_text is the inverse."""
    args = call.arguments if call.arguments is not None else {"input": call.input}
    return {"id": call_id, "type": "function",
            "function": {"name": call.tool, "arguments": json.dumps(args, ensure_ascii=False)}}


def call_text(name: str, arguments: str, tool_format: str = "tags") -> str:
    """A tool call as the model writes it, from an OpenAI tool call's name and arguments (JSON text)."""
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        args = arguments
    if tool_format == "json":
        return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n</tool_call>"
    if isinstance(args, dict):
        body = args["input"] if set(args) == {"input"} else json.dumps(args, ensure_ascii=False)
    else:
        body = str(args)
    return f"<{name}>{body}</{name}>"


def tool_messages(calls: list[ToolCallRecord], text: str, call_ids: list[str]) -> list[dict]:
    """The assistant message that made `calls` (one pause: its turn's `text`) and a tool message per call."""
    out = [{"role": "assistant", "content": text,
            "tool_calls": [openai_tool_call(c, i) for c, i in zip(calls, call_ids, strict=True)]}]
    return out + [{"role": "tool", "tool_call_id": i, "name": c.tool, "content": c.output, "ok": c.ok}
                  for c, i in zip(calls, call_ids, strict=True)]


def split_trajectory(tokenizer, traj: Trajectory, completion_id: str, index: int, stop: str | None = None):
    """(agent_messages, final content) of choice `index`: for each pause whose results were appended,
    the assistant message with its calls and their tool messages; then the text after the last
    results (cut before `stop`, the stop string that ended it). Calls whose results did not fit in the
    budget stay in the final text."""
    msgs, pos, turn, k = [], 0, [], 0
    for call in traj.tool_calls:
        turn.append(call)
        a, b = call.result_span
        if b <= a:  # more calls of this pause follow (json), or its results were never appended
            continue
        ids = [call_id(completion_id, index, k + j) for j in range(len(turn))]
        msgs += tool_messages(turn, decode(tokenizer, traj.response_ids[pos:a]), ids)
        pos, turn, k = b, [], k + len(turn)
    return msgs, final_text(decode(tokenizer, traj.response_ids[pos:]), stop)


def final_text(text: str, stop: str | None) -> str:
    if stop and stop in text:
        return text[: text.index(stop)]
    return text


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def call_id(completion_id: str, index: int, k: int) -> str:
    """The id of choice `index`'s k-th executed tool call (the same in a stream and a full response)."""
    return f"call_{completion_id.removeprefix('chatcmpl-')}_{index}_{k}"


# ---- responses ----------------------------------------------------------------------------------------
def usage(prompt_len: int, trajs: list[Trajectory]) -> dict:
    gen = sum(t.n_generated_tokens for t in trajs)
    tool = sum(len(t.response_ids) for t in trajs) - gen
    return {"prompt_tokens": prompt_len, "completion_tokens": gen, "total_tokens": prompt_len + gen,
            "tool_result_tokens": tool}


def completion(completion_id: str, model: str, created: int, choices: list[dict], usage_: dict) -> dict:
    return {"id": completion_id, "object": "chat.completion", "created": created, "model": model,
            "choices": choices, "usage": usage_, "system_fingerprint": None}


def choice(index: int, content: str, agent_msgs: list[dict], agent_reason: str) -> dict:
    return {"index": index, "message": {"role": "assistant", "content": content, "agent_messages": agent_msgs},
            "finish_reason": FINISH.get(agent_reason, "stop"), "agent_finish_reason": agent_reason,
            "logprobs": None}


def chunk(completion_id: str, model: str, created: int, choices: list[dict], usage_: dict | None = None) -> dict:
    out = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": choices, "system_fingerprint": None}
    if usage_ is not None:
        out["usage"] = usage_
    return out


def delta(index: int, finish: str | None = None, agent_reason: str | None = None, **fields) -> dict:
    d = {"index": index, "delta": fields, "finish_reason": finish, "logprobs": None}
    if agent_reason is not None:
        d["agent_finish_reason"] = agent_reason
    return d


def now() -> int:
    return int(time.time())


class FinalTextStream:
    """Which of a choice's generated text may be streamed as `content` right away.

    Content is the final turn only, and a turn is final when it ends without a tool call. So the text
    of the current turn is held until the model opens `<answer>` (from then on it streams token by
    token) or the turn ends; a tool call starts a new turn. With stop strings, the last
    len(longest stop) - 1 characters are held back, so that a stop string is never sent. (If a model
    calls a tool after opening `<answer>`, the text sent so far stays sent.)"""

    def __init__(self, tokenizer, stops: tuple[str, ...] = ()):
        self.tok, self.stops, self.hold = tokenizer, stops, max((len(s) for s in stops), default=1) - 1
        self.new_turn()

    def new_turn(self) -> None:
        self.ids: list[int] = []
        self.text, self.sent, self.live = "", 0, False
        self._prefix = self._read = 0  # incremental detokenization: ids[_prefix:_read] give context only

    def tokens(self, ids: list[int]) -> str:
        """Take newly generated tokens; returns the text to send now."""
        self.ids += ids
        # decode only the newest tokens, with the previous ones as context (a full decode per token
        # would cost O(n^2) per turn); wait while they end in half a UTF-8 character
        before = decode(self.tok, self.ids[self._prefix : self._read])
        now = decode(self.tok, self.ids[self._prefix :])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self.text += now[len(before) :]
            self._prefix, self._read = self._read, len(self.ids)
        self.live = self.live or ANSWER_OPEN in self.text
        if not self.live:
            return ""
        end = min([len(self.text) - self.hold] + [self.text.index(s) for s in self.stops if s in self.text])
        out = self.text[self.sent : end] if end > self.sent else ""
        self.sent += len(out)
        return out

    def finish(self, content: str) -> str:
        """The rest of the final content, once the conversation is done."""
        return content[self.sent :]
