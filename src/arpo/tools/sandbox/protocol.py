"""The sandbox's wire protocol: every message the trainer, the zygote, init and a session's
processes send each other, defined once (its letter, its fields, the descriptors that travel with
it), with the encoder and decoder both ends use.

A message is an ASCII letter (or word), then its text fields separated by single spaces, then a
newline ("line" framing); a message of "bare" framing is its letter alone, sent with one
`sendmsg` that carries its descriptors (SCM_RIGHTS), so the receiver reads it as one. A field
named with a trailing "..." takes the words left over by the others (an error text, "wexit 3").
Descriptors are listed in the order they travel; they are passed beside the bytes
(`socket.send_fds`), never encoded. `Channel.decode` refuses an unknown letter or a malformed
line with a `ProtocolError` that names the channel, the line and what it expected: a receiver
catches it and drops the message (a sandbox process goes on serving; the trainer reports an error
result), it never crashes on one.

Channels (who writes -> who reads):

* ZYGOTE      trainer -> zygote (SOCK_SEQPACKET): "spawn" + a new worker's descriptors.
* CTL         c1 / init -> trainer, a worker's control socket: P, E, R, X, T.
  The trainer -> init direction of a one-shot worker carries ARM ("C" + CODE_HEADER, binary).
* SESSION     trainer -> a session family's init, on the same socket: X, F, Q, K.
* REPORT      init -> trainer, a session call's report pipe (init holds its write end, never
              passed on): D.
* STATE       init -> a state, and a state -> its runner: X, F (bare).
* FAMILY      a state or runner -> init (SO_PASSCRED: init takes the sender's pid from the kernel,
              never from the text): P, C, S. A call's code holds its runner's end: init trusts a
              line only from the process it expects (session.py).
* RUNNER      a one-shot runner -> trainer, its report pipe (closed before the code runs): R.
* the code pipe, trainer -> runner: CODE_HEADER (timeout, length) + the code's UTF-8 bytes.

Loaded inside the zygote (see the package docstring): standard library only."""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

CODE_HEADER = struct.Struct("!dQ")  # (timeout_s, len(code)) in front of the code bytes, and after ARM


class ProtocolError(ValueError):
    """A message that is not one of its channel's, or does not fit its definition."""


@dataclass(frozen=True)
class CallEnd:
    """How a call ended, decoded once from the message that said so (the trainer then reads its
    fields, never a line again): "exit" (the runner's exit status `code`), "signal" (killed by signal
    `code`), "oom" (killed by its memory cgroup), "deadline" (init's deadline passed), "dropped" (its
    session state was dropped under it), "gone" (the sandbox ended without a word) or "failed" (`why`)."""

    kind: Literal["exit", "signal", "oom", "deadline", "dropped", "gone", "failed"]
    code: int = 0
    why: str = ""

    def __str__(self) -> str:
        if self.kind in ("exit", "signal"):
            return f"{self.kind} {self.code}"
        return f"failed: {self.why}" if self.kind == "failed" else self.kind


def call_end(how: str) -> CallEnd:
    """The CallEnd of ENDED's or DONE's `how` field ("wexit N", "signal N", "oom", "dropped"); any
    other text is a failed end that quotes it."""
    word, _, num = how.partition(" ")
    if word in ("wexit", "signal") and num.lstrip("-").isdigit():
        return CallEnd("exit" if word == "wexit" else "signal", int(num))
    if how in ("oom", "dropped"):
        return CallEnd("oom" if how == "oom" else "dropped")
    return CallEnd("failed", why=f"init said {how!r}")


class Message:
    """One kind of message: `letter`, its text `fields` (the last one or one named "name..." may
    hold spaces), the descriptors `fds` that travel with it (in order), its `framing` ("line":
    text + newline; "bare": the letter alone, one send each), and what it means (`doc`)."""

    __slots__ = ("channel", "letter", "fields", "fds", "framing", "doc")

    def __init__(self, channel: str, letter: str, fields: tuple[str, ...] = (), fds: tuple[str, ...] = (),
                 framing: str = "line", doc: str = ""):
        if framing not in ("line", "bare") or (framing == "bare" and fields):
            raise ValueError(f"message {letter!r}: framing {framing!r} with fields {fields}")
        if sum(f.endswith("...") for f in fields) > 1:
            raise ValueError(f"message {letter!r}: at most one field may take the rest of the line")
        self.channel, self.letter, self.fields, self.fds = channel, letter, fields, fds
        self.framing, self.doc = framing, doc

    def __repr__(self) -> str:
        return f"<{self.channel} {self.letter}>"

    def encode(self, *values: object) -> bytes:
        """The message's bytes; `values` one per field, in order (str() of each)."""
        if len(values) != len(self.fields):
            raise ProtocolError(f"{self!r} takes {len(self.fields)} field(s) {self.fields}, got {len(values)}")
        words = [self.letter]
        for name, value in zip(self.fields, values, strict=True):
            text = str(value)
            if "\n" in text or not text or (" " in text and not name.endswith("...")):
                raise ProtocolError(f"{self!r}: field {name!r} must be one non-empty line"
                                    f"{'' if name.endswith('...') else ' without spaces'}, got {text!r}")
            words.append(text)
        data = " ".join(words)
        return data.encode() if self.framing == "bare" else data.encode() + b"\n"

    def parse(self, body: str) -> dict[str, str]:
        """The fields of a line's `body` (what follows the letter and its space) by name: one word
        each (non-empty), the "..." field what the others leave (any text, spaces included)."""
        words = body.split(" ")
        rest = next((i for i, f in enumerate(self.fields) if f.endswith("...")), None)
        if rest is not None:  # the "..." field takes what the fields before and after it leave
            after = len(self.fields) - rest - 1
            if len(words) < len(self.fields):
                raise ProtocolError(f"{self!r} takes the fields {' '.join(self.fields)}, got {body[:80]!r}")
            words = [*words[:rest], " ".join(words[rest:len(words) - after]), *words[len(words) - after:]]
        fixed = [w for i, w in enumerate(words) if i != rest]
        if len(words) != len(self.fields) or "" in fixed:
            raise ProtocolError(f"{self!r} takes the fields {' '.join(self.fields)}, got {body[:80]!r}")
        return {f.rstrip("."): w for f, w in zip(self.fields, words, strict=True)}


class Channel:
    """The messages one channel carries, by letter; `decode` is how its receiver reads one."""

    def __init__(self, name: str, *messages: Message):
        self.name = name
        self.messages = {m.letter: m for m in messages}
        if len(self.messages) != len(messages) or any(m.channel != name for m in messages):
            raise ValueError(f"channel {name}: letters must be unique and the messages its own")

    def decode(self, line: bytes | str) -> tuple[Message, dict[str, str]]:
        """(the message, its fields by name) of one line (without its newline) or one bare message;
        a `ProtocolError` for anything else."""
        text = line.decode("ascii", "replace") if isinstance(line, bytes) else line
        letter, space, body = text.partition(" ")
        msg = self.messages.get(letter)
        if msg is None:
            raise ProtocolError(f"unknown message {text[:80]!r} on the {self.name} channel; expected one of "
                                f"{', '.join(self.messages)}")
        if not msg.fields:
            if space:
                raise ProtocolError(f"{msg!r} takes no fields, got {text[:80]!r}")
            return msg, {}
        if not space:
            raise ProtocolError(f"{msg!r} takes the fields {' '.join(msg.fields)}, got none")
        return msg, msg.parse(body)

    def dispatch(self, line: bytes | str, handlers: Mapping[Message, Callable[..., Any]], *args: object) -> Any:
        """Decode `line` and call its message's handler with `args` and the message's fields as
        keywords: its answer. A message of this channel without a handler here is refused like an
        unknown one."""
        msg, fields = self.decode(line)
        handler = handlers.get(msg)
        if handler is None:
            raise ProtocolError(f"{msg!r} is not expected here; expected one of "
                                f"{', '.join(m.letter for m in handlers)}")
        return handler(*args, **fields)


# ---- trainer -> zygote --------------------------------------------------------------------------
SPAWN = Message("zygote", "spawn", fds=("ctl", "out_w", "code_r", "rep_w"), framing="bare",
                doc="start a worker: its control socket and its runner's output, code and report pipes")
ZYGOTE = Channel("zygote", SPAWN)

# ---- c1 / init -> trainer: a worker's control socket --------------------------------------------
INIT_PID = Message("ctl", "P", ("pid",), fds=("pidfd",), doc="c1: init's pid, and its pidfd to kill it by")
FAILED = Message("ctl", "E", ("why...",), doc="the worker could not be set up (spawn, namespaces, cgroups)")
FAMILY_READY = Message("ctl", "R", doc="a session family's init: its root state is up")
ENDED = Message("ctl", "X", ("how...",), doc="one-shot init: how the runner ended (wexit N, signal N, oom); "
                                             "a session family's init: 'dead <id>', a state vanished")
DEADLINE = Message("ctl", "T", doc="one-shot init: the call's deadline (timeout + 1 s) passed")
CTL = Channel("ctl", INIT_PID, FAILED, FAMILY_READY, ENDED, DEADLINE)

# ---- trainer -> one-shot init, on the control socket: arm init's own deadline --------------------
ARM = b"C"  # + CODE_HEADER.pack(timeout_s, len(code)): binary, not a line


def encode_arm(timeout_s: float, n: int) -> bytes:
    """ARM: tell a one-shot init the call's timeout (it kills the runner at timeout + 1 s)."""
    return ARM + CODE_HEADER.pack(timeout_s, n)


def decode_arm(inbox: bytes) -> float | None:
    """The timeout an ARM at the start of `inbox` carries; None until all of it has arrived."""
    if len(inbox) < len(ARM) + CODE_HEADER.size:
        return None
    if not inbox.startswith(ARM):
        raise ProtocolError(f"init expected {ARM!r} + a code header on its control socket, got {inbox[:16]!r}")
    timeout_s, _n = CODE_HEADER.unpack(inbox[len(ARM):len(ARM) + CODE_HEADER.size])
    return timeout_s


def encode_code(timeout_s: float, code: bytes) -> bytes:
    """What the code pipe carries: the header (timeout, length), then the code."""
    return CODE_HEADER.pack(timeout_s, len(code)) + code


# ---- trainer -> a session family's init ---------------------------------------------------------
RUN = Message("session", "X", ("src", "dst"), fds=("code_r", "out_w", "rep_w"),
              doc="run a call from state src; its runner's child becomes state dst; init keeps rep_w")
FORK = Message("session", "F", ("src", "dst"), doc="a branch: fork state src into state dst")
DROP = Message("session", "Q", ("sid",), doc="drop a state (its snapshot); a call still running reports 'dropped'")
KILL = Message("session", "K", ("sid",), doc="SIGKILL a state's or a running call's process")
SESSION = Channel("session", RUN, FORK, DROP, KILL)

# ---- init -> trainer: a session call's report pipe ----------------------------------------------
DONE = Message("report", "D", ("how...", "state"),
               doc="how the call's process ended (wexit N, signal N, dropped) and whether it handed "
                   "the session on (state 1: the next call starts from it)")
REPORT = Channel("report", DONE)

# ---- init -> a state, a state -> its runner (bare: one send each, the descriptors ride with it) --
STATE_RUN = Message("state", "X", fds=("code_r", "out_w", "chan"), framing="bare",
                    doc="run a call (the state hands it to its runner); chan: the new state's channel")
STATE_FORK = Message("state", "F", fds=("chan",), framing="bare",
                     doc="fork this state into a branch's state, which talks to init on chan")
STATE = Channel("state", STATE_RUN, STATE_FORK)

# ---- a state or runner -> init (init reads the sender's pid from the kernel) --------------------
IS_STATE = Message("family", "P", ("pid...",), doc="a state is up (the pid text is informational)")
CALL_STARTED = Message("family", "C", fds=("holder",),
                       doc="a runner starts its call: its exit is the report; holder (optional): the "
                           "pidfd of the process holding its memory, killed after the report")
CARRIED = Message("family", "S", doc="the runner's child carries the state on (sent before the runner exits)")
FAMILY = Channel("family", IS_STATE, CALL_STARTED, CARRIED)

# ---- a one-shot runner -> trainer, its report pipe ----------------------------------------------
RUNNER_READY = Message("runner", "R", doc="the runner is locked down and waits for its code")
RUNNER = Channel("runner", RUNNER_READY)

CHANNELS = (ZYGOTE, CTL, SESSION, REPORT, STATE, FAMILY, RUNNER)


def lines(buf: bytes, data: bytes, keep: int = 4096) -> tuple[list[bytes], bytes]:
    """Split what a stream delivered after `buf` (the last read's unfinished tail) into whole lines:
    (the lines, the new unfinished tail, of which at most its last `keep` bytes are kept)."""
    parts = (buf + data).split(b"\n")
    tail = parts.pop()
    return parts, tail[-keep:]
