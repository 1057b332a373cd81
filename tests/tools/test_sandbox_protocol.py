"""The sandbox's wire protocol (tools/sandbox/protocol.py): every message round-trips, its bytes are
the ones both ends have always spoken, and an unknown or malformed message is refused with a
ProtocolError that says what came and what was expected — never a crash of the trainer or of a
session family's init."""

from __future__ import annotations

import logging
import os
import socket

import pytest

from arpo.tools.sandbox import protocol as p
from arpo.tools.sandbox.pool import SandboxUnavailable, Worker
from arpo.tools.sandbox.protocol import CallEnd, call_end

ALL = [m for ch in p.CHANNELS for m in ch.messages.values()]


def _values(msg: p.Message) -> tuple[str, ...]:
    """A value per field: the "..." one with spaces in it."""
    return tuple(f"{f.rstrip('.')} with spaces" if f.endswith("...") else f"v{i}" for i, f in enumerate(msg.fields))


def test_every_message_is_defined_once_in_one_channel():
    defined = [v for v in vars(p).values() if isinstance(v, p.Message)]
    assert sorted(map(id, defined)) == sorted(map(id, ALL))  # each module-level message is in a channel
    for ch in p.CHANNELS:
        assert all(m.channel == ch.name for m in ch.messages.values())


@pytest.mark.parametrize("msg", ALL, ids=repr)
def test_every_message_round_trips(msg):
    values = _values(msg)
    data = msg.encode(*values)
    channel = next(ch for ch in p.CHANNELS if ch.name == msg.channel)
    if msg.framing == "bare":
        assert data == msg.letter.encode() and not msg.fields
    else:
        assert data.endswith(b"\n") and data.count(b"\n") == 1
        data = data[:-1]
    got, fields = channel.decode(data)
    assert got is msg
    assert fields == {f.rstrip("."): v for f, v in zip(msg.fields, values, strict=True)}
    assert channel.decode(data.decode())[0] is msg  # str lines (the trainer's) decode alike


def test_the_bytes_on_the_wire_are_the_ones_both_ends_spoke_before():
    """protocol.py replaced f-strings at both ends: the bytes did not change (golden values)."""
    assert p.RUN.encode("0", "7") == b"X 0 7\n"
    assert p.FORK.encode("3", "8") == b"F 3 8\n"
    assert p.KILL.encode("8") + p.DROP.encode("8") == b"K 8\nQ 8\n"
    assert p.DONE.encode("wexit 3", 1) == b"D wexit 3 1\n"
    assert p.DONE.encode("signal 9", 0) == b"D signal 9 0\n"
    assert p.DONE.encode("dropped", 0) == b"D dropped 0\n"
    assert p.ENDED.encode("dead 4") == b"X dead 4\n"
    assert p.ENDED.encode("oom") == b"X oom\n"
    assert p.DEADLINE.encode() == b"T\n"
    assert p.FAMILY_READY.encode() == b"R\n" == p.RUNNER_READY.encode()
    assert p.INIT_PID.encode(123) == b"P 123\n" == p.IS_STATE.encode(123)
    assert p.FAILED.encode("sandbox setup failed: OSError: x") == b"E sandbox setup failed: OSError: x\n"
    assert (p.CALL_STARTED.encode(), p.CARRIED.encode()) == (b"C\n", b"S\n")
    assert (p.STATE_RUN.encode(), p.STATE_FORK.encode(), p.SPAWN.encode()) == (b"X", b"F", b"spawn")
    assert p.encode_arm(2.5, 7) == b"C" + p.CODE_HEADER.pack(2.5, 7)
    assert p.encode_code(2.5, b"print(1)") == p.CODE_HEADER.pack(2.5, 8) + b"print(1)"
    assert p.DONE.parse("signal 9 1") == {"how": "signal 9", "state": "1"}


@pytest.mark.parametrize(("channel", "line", "says"), [
    (p.SESSION, "Z 1 2", "unknown message 'Z 1 2' on the session channel; expected one of X, F, Q, K"),
    (p.SESSION, "X 0", "takes the fields src dst"),
    (p.SESSION, "X 0 1 2", "takes the fields src dst"),
    (p.SESSION, "X 0  1", "takes the fields src dst"),  # an empty field
    (p.SESSION, "Q", "takes the fields sid, got none"),
    (p.SESSION, "", "unknown message ''"),
    (p.REPORT, "D 1", "takes the fields how... state"),
    (p.REPORT, "D wexit 3 ", "takes the fields how... state"),
    (p.FAMILY, "C extra", "takes no fields"),
    (p.FAMILY, b"\xff\xfe", "unknown message"),
    (p.CTL, "Tx", "unknown message 'Tx' on the ctl channel"),
    (p.STATE, b"XF", "unknown message 'XF' on the state channel"),
])
def test_unknown_or_malformed_messages_are_refused_with_a_clear_error(channel, line, says):
    with pytest.raises(p.ProtocolError) as e:
        channel.decode(line)
    assert says in str(e.value)


def test_encode_refuses_what_would_break_the_framing():
    for bad in [("a\nb", "1"), ("a b", "1"), ("", "1")]:
        with pytest.raises(p.ProtocolError, match="must be one non-empty line"):
            p.RUN.encode(*bad)
    with pytest.raises(p.ProtocolError, match="takes 2 field"):
        p.RUN.encode("1")
    with pytest.raises(p.ProtocolError, match="without spaces"):
        p.DONE.encode("wexit 0", "1 1")


def test_dispatch_calls_one_handler_per_message_and_refuses_the_rest():
    seen = []
    handlers = {p.RUN: lambda tag, src, dst: seen.append((tag, "run", src, dst)) or "ran",
                p.DROP: lambda tag, sid: seen.append((tag, "drop", sid))}
    assert p.SESSION.dispatch("X 0 5", handlers, "t") == "ran"
    p.SESSION.dispatch(b"Q 5", handlers, "t")
    assert seen == [("t", "run", "0", "5"), ("t", "drop", "5")]
    with pytest.raises(p.ProtocolError, match="is not expected here; expected one of X, Q"):
        p.SESSION.dispatch("K 5", handlers, "t")  # a session message without a handler here


def test_arm_decodes_only_when_whole():
    data = p.encode_arm(1.5, 10)
    assert p.decode_arm(data[:-1]) is None
    assert p.decode_arm(data + b"more") == 1.5
    with pytest.raises(p.ProtocolError, match="init expected b'C'"):
        p.decode_arm(b"Z" + data[1:])


def test_lines_keeps_the_unfinished_tail():
    got, tail = p.lines(b"P 1", b"2\nC\nS")
    assert (got, tail) == ([b"P 12", b"C"], b"S")
    assert p.lines(b"", b"x" * 5000)[1] == b"x" * 4096


@pytest.fixture
def worker():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fds = [*os.pipe(), *os.pipe(), *os.pipe()]
    w = Worker(a, fds[0], fds[3], fds[4], "namespaces")
    yield w, b
    w.close()
    b.close()
    for fd in (fds[1], fds[2], fds[5]):
        os.close(fd)


def test_the_trainer_refuses_a_malformed_message_at_start_with_a_clear_error(worker):
    from arpo.tools.sandbox.protocol import CTL, RUNNER

    w, _ = worker
    w._starting("P 41", CTL)
    w._starting("R", RUNNER)
    assert (w.pid, w.ready) == (41, True)
    for line, says in [("P forty", "the pid must be a number"), ("Z", "unknown message 'Z' on the ctl channel"),
                       ("E no memory cgroup", "no memory cgroup"), ("T", "is not expected here")]:
        with pytest.raises(SandboxUnavailable, match=says):
            w._starting(line, CTL)


def test_a_one_shot_call_ignores_a_malformed_line_from_init_and_logs_it(worker, caplog):
    from arpo.tools.python import _init_status

    w, peer = worker
    peer.sendall(b"what is this\nP 3\n")
    with caplog.at_level(logging.WARNING, logger="arpo.tools.python"):
        assert _init_status(w) is None
    assert "unknown message 'what is this' on the ctl channel" in caplog.text
    peer.sendall(b"X wexit 0\n")
    assert _init_status(w) == CallEnd("exit", 0)


def test_how_a_call_ended_is_decoded_once_into_a_typed_value(worker):
    """Issue 64: the result path turned init's decoded messages back into "X oom" / "X signal 9" strings
    and parsed them again; now the message that ends a call is decoded once into a CallEnd, and the
    result reads its fields."""
    from arpo.tools.python import _init_status
    from arpo.tools.sandbox.result import call_result

    w, peer = worker
    for line, end in [(b"X signal 9", CallEnd("signal", 9)), (b"X oom", CallEnd("oom")),
                      (b"X wexit -3", CallEnd("exit", -3)), (b"T", CallEnd("deadline")),
                      (b"E no cgroup here", CallEnd("failed", why="no cgroup here")),
                      (b"X dead 4", CallEnd("failed", why="init said 'dead 4'"))]:
        peer.sendall(line + b"\n")
        assert _init_status(w) == end, line
    assert call_end("dropped") == CallEnd("dropped") and call_end("signal x").kind == "failed"
    caps = dict(max_output_chars=100, max_read_bytes=100, memory_mb=64)
    said = {str(end): call_result(b"out", end, 2.0, False, False, 0.1, "namespaces", **caps)
            for end in (CallEnd("signal", 9), CallEnd("oom"), CallEnd("exit", 0), CallEnd("exit", 1),
                        CallEnd("exit", 7), CallEnd("deadline"), CallEnd("gone"))}
    assert said["signal 9"].output == "out\nError: the process was killed by SIGKILL (Killed)"
    assert said["oom"].output == "out\nError: memory limit exceeded (64 MB); the program was killed"
    assert said["exit 0"].ok and said["exit 0"].output == "out" and not said["exit 1"].ok
    assert said["exit 7"].output.endswith("Error: the program exited with status 7")
    assert said["deadline"].output.endswith("Error: execution timed out after 2.0 s")
    assert said["gone"].output.endswith("Error: the sandbox failed (gone)")
    assert said["oom"].meta["status"] == "oom" and said["signal 9"].meta["status"] == "signal 9"


def test_a_session_init_drops_malformed_commands_and_keeps_serving():
    """Garbage on a session family's control socket is refused by its init (protocol.py), which
    goes on serving: the session keeps its variables and its next call runs. (Before, a malformed
    "X ..." line took the descriptors of the call after it, which then died: 1 of 2 runs on main.)"""
    from arpo.tools.python_session import PythonSessionTool

    tool = PythonSessionTool(timeout_s=5, memory_mb=256, max_sessions=2, pool_size=1, preimport=())
    try:
        if tool.isolation != "namespaces":
            pytest.skip("sessions need namespace isolation (root)")
        assert tool.run_session("a", "x = 41").ok
        fam = tool._sessions["a"].family
        for want in range(42, 45):
            with fam.lock:
                fam.ctl().sendall(b"Z 1 2\nX 0\nQ\nK nobody\nF 99 100\n\xff\xfe\nX 0 1 2\n")
            r = tool.run_session("a", "x += 1\nprint(x)")
            assert r.ok and r.output == str(want), r.output
    finally:
        tool.close()


def test_a_session_report_reads_as_a_status_and_a_malformed_one_as_an_error():
    from arpo.tools.python_session import _report_status

    assert _report_status(b"D wexit 0 1") == (CallEnd("exit", 0), True)
    assert _report_status(b"D signal 9 0") == (CallEnd("signal", 9), False)
    status, alive = _report_status(b"D ok")
    assert not alive and status.kind == "failed" and status.why.startswith("the python session's report was malformed")
    assert "takes the fields how... state" in status.why
