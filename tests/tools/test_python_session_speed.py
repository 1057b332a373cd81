"""Issue 27: session calls stay as fast as before their status became unforgeable.

A session call's status is the exit status of the process that ran it (read by the sandbox's
init), so every call needs a process of its own. That process is forked before the call comes,
while the model generates (docs/sandbox.md, "Sessions"); its fork (two, to be adopted by init) is
what made calls 3-4x slower when it happened after the code was sent. The first test checks the
mechanism (no timing involved: it cannot flake on a loaded machine); the second compares session
calls with one-shot calls measured interleaved in the same process, with a bound several times
looser than measured.
"""

import statistics
import time

import pytest

from arpo.tools.python import PythonTool
from arpo.tools.python_session import PythonSessionTool

# how long the process running this call has existed (seconds, 10 ms resolution)
AGE = """
import os
with open('/proc/self/stat') as f:
    start = int(f.read().rsplit(')', 1)[1].split()[19])
with open('/proc/uptime') as f:
    up = float(f.read().split()[0])
print(round(up - start / os.sysconf('SC_CLK_TCK'), 2))
"""


@pytest.fixture(scope="module")
def sess():
    t = PythonSessionTool(timeout_s=10, memory_mb=256, max_sessions=8, pool_size=1)
    if t.isolation != "namespaces":
        t.close()
        pytest.skip("sessions need namespace isolation (root)")
    yield t
    t.close()


@pytest.mark.parametrize("how", ["next call", "branch"])
def test_a_calls_process_is_forked_before_the_call_comes(sess, how):
    """The process that runs a call existed before the call was sent: it was forked while the
    model generated (here: a 1.5 s pause), after the previous call or the branch."""
    assert sess.run_session("a", "x = 1").ok
    key = "a"
    if how == "branch":
        sess.fork("a", "b", 1)
        key = "b"
        assert sess.run_session("b", "x += 1").ok  # the branch's first call starts its state
    time.sleep(1.5)
    r = sess.run_session(key, AGE)
    assert r.ok, r.output
    age = float(r.output)
    assert age > 0.75, f"the call's process is {age} s old: it was forked after the call came"
    assert sess.run_session(key, "print(x)").output == ("1" if how == "next call" else "2")
    sess.end("a")
    sess.end("b")


def test_session_calls_are_not_much_slower_than_one_shot_calls(sess):
    """Trivial calls, session and one-shot interleaved in one process (the machine's load hits
    both alike), p50s. Measured on this 2-core machine at load 15: session / one-shot 1.5-1.7
    (24-32 ms vs 14-21 ms); with the call's process forked after the call came (de74316) 7.6-12
    (80-92 ms vs 8-11 ms). The bound, 5x plus 3 ms, is 3x the measured ratio."""
    one = PythonTool(timeout_s=10, memory_mb=256, pool_size=2)
    try:
        one.warm_up()
        assert sess.run_session("t", "i = 0").ok
        ts_sess, ts_one = [], []
        for i in range(30):
            t0 = time.perf_counter()
            r = sess.run_session("t", f"i = {i}\nprint(i)")
            ts_sess.append(time.perf_counter() - t0)
            assert r.ok and r.output == str(i), r.output
            time.sleep(0.02)  # the model generating: the next call's process is forked meanwhile
            t0 = time.perf_counter()
            r = one(f"print({i})")
            ts_one.append(time.perf_counter() - t0)
            assert r.ok and r.output == str(i), r.output
            time.sleep(0.02)
        sess.end("t")
    finally:
        one.close()
    p_sess, p_one = statistics.median(ts_sess), statistics.median(ts_one)
    assert p_sess < 5 * p_one + 0.003, f"session p50 {p_sess * 1e3:.1f} ms vs one-shot p50 {p_one * 1e3:.1f} ms"
