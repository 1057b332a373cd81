"""Issue 27, item 3: a session call's status cannot be forged by the code it ran (as in the one-shot
tool: the status is how the call's process ended, read by the sandbox's init)."""

import pytest

from arpo.tools.python_session import PythonSessionTool

# write a fake "done, ok" report to every descriptor the call can reach, then fail
FORGE = """
import os
for fd in range(3, 256):
    try:
        os.write(fd, b"D ok\\n")
    except OSError:
        pass
raise ValueError("boom")
"""


@pytest.fixture(scope="module")
def sess():
    t = PythonSessionTool(timeout_s=5, memory_mb=256, max_sessions=8, pool_size=1, preimport=())
    if t.isolation != "namespaces":
        t.close()
        pytest.skip("sessions need namespace isolation (root)")
    yield t
    t.close()


def test_a_forged_ok_report_does_not_make_a_failed_call_ok(sess):
    assert sess.run_session("f", "x = 41").ok
    r = sess.run_session("f", FORGE)
    assert not r.ok and "ValueError: boom" in r.output
    again = sess.run_session("f", "x += 1\nprint(x)")  # the session goes on
    assert again.ok and again.output == "42"
    sess.end("f")


def test_statuses_come_from_how_the_call_ended(sess):
    assert sess.run_session("s", "y = 1\nprint('hi')").output == "hi"
    r = sess.run_session("s", "import sys\nsys.exit(3)")
    assert not r.ok and "exited with status 3" in r.output
    assert sess.run_session("s", "print(y)").output == "1"  # SystemExit does not end the session
    r = sess.run_session("s", "import os\nos.write(1, b'bye')\nos._exit(0)")
    assert r.ok and r.output == "bye"  # a program may end itself, as in the one-shot tool
    r = sess.run_session("s", "print(y)")  # ... which ends the session: the next call says so
    assert "fresh session" in r.output and not r.ok
    r = sess.run_session("s", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert not r.ok and "killed by SIGKILL" in r.output
    sess.end("s")


def test_forks_still_start_from_the_parents_state(sess):
    sess.run_session("a", "v = [1]")
    sess.run_session("a", "v.append(2)")
    sess.fork("a", "b", 1)
    assert sess.run_session("b", "print(v)").output == "[1]"
    assert sess.run_session("a", "print(v)").output == "[1, 2]"
    sess.end("a")
    sess.end("b")
