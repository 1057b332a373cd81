"""Stateful python sessions that fork with the rollout tree (issue 19, part 1)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from arpo.tools.python_session import PythonSessionTool


def _procs_in(uid_range) -> int:
    lo, hi = uid_range
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/status") as f:
                    uid = int(next(ln for ln in f if ln.startswith("Uid:")).split()[1])
            except (OSError, StopIteration, ValueError):
                continue
            n += lo <= uid < hi
    return n


def _wait(pred, timeout=5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


@pytest.fixture(scope="module")
def sess():
    t = PythonSessionTool(timeout_s=3, memory_mb=256, max_sessions=80)
    if t.isolation != "namespaces":
        t.close()
        pytest.skip("sessions need namespace isolation (root)")
    yield t
    t.close()


def test_state_persists_across_calls(sess):
    assert sess.run_session("p", "import math\nx = 6\nopen('notes.txt', 'w').write('six')").ok
    r = sess.run_session("p", "x *= 7\nprint(x, math.sqrt(x * 42), open('notes.txt').read())")
    assert r.ok and r.output == "42 42.0 six"
    sess.end("p")


def test_a_branch_starts_from_the_parent_at_the_branch_point(sess):
    sess.run_session("a", "v = [1]\nopen('f', 'w').write('one')")
    sess.run_session("a", "v.append(2)\nopen('f', 'w').write('two')")  # the parent moves on after call 1
    sess.fork("a", "b", 1)  # b branched right after a's first call
    sess.fork("a", "c", 1)
    assert sess.run_session("b", "print(v, open('f').read())").output == "[1] one"
    sess.run_session("b", "v.append('b')\nopen('f', 'w').write('bee')\nopen('only_b', 'w').write('x')")
    assert sess.run_session("c", "import os\nprint(v, open('f').read(), os.path.exists('only_b'))").output \
        == "[1] one False"  # siblings do not see each other
    assert sess.run_session("a", "print(v, open('f').read())").output == "[1, 2] two"  # nor the parent
    assert sess.run_session("b", "print(v)").output == "[1, 'b']"
    sess.fork("a", "d", 2)  # a later branch point: after call 2
    assert sess.run_session("d", "print(v)").output == "[1, 2]"
    sess.fork("a", "fresh", 0)  # before any call: nothing to inherit
    assert not sess.run_session("fresh", "print(v)").ok
    for k in "abcd":
        sess.end(k)
    sess.end("fresh")


def test_a_calls_subprocesses_report_their_exit_status(sess):
    """A call's process waits for its children as any program does (SIGCHLD not ignored: at
    de74316 every subprocess exited 0)."""
    code = "import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', 'raise SystemExit(3)']).returncode)"
    assert sess.run_session("sp", code).output == "3"
    assert sess.run_session("sp", code).output == "3"
    sess.end("sp")


def test_limits_hold_per_session_and_a_failed_session_restarts(sess):
    sess.run_session("m", "keep = 5")
    r = sess.run_session("m", "x = bytearray(2 * 1024**3)")
    assert not r.ok and "MemoryError" in r.output
    assert sess.run_session("m", "print(keep)").output == "5"  # an exception does not end the session
    r = sess.run_session("m", "import time\ntime.sleep(30)", timeout_s=1)
    assert not r.ok and "timed out after 1" in r.output
    r = sess.run_session("m", "print('keep' in globals())")
    assert r.ok and "started a fresh session" in r.output and r.output.endswith("False")
    r = sess.run_session("m", "import os\nos._exit(3)")
    assert not r.ok
    assert "fresh session" in sess.run_session("m", "print(1)").output
    sess.end("m")


def test_a_long_session_keeps_its_variables_and_files(sess):
    """Issue 37: every snapshot held one of the code's 64 process slots, so a session's 63rd call
    ran its code, came back as "killed by SIGKILL", lost its variables and files, and the next call
    started afresh. Now a family keeps its last `session_snapshots` (32) snapshots, with slots of
    their own: 120 calls keep everything; a branch from a recent snapshot still works, one from a
    dropped snapshot starts fresh and says which limit dropped it."""
    assert sess.run_session("long", "x = 0\nopen('f', 'w').write('')").ok
    for i in range(1, 121):
        r = sess.run_session("long", "x += 1\nopen('f', 'a').write('.')\nprint(x, len(open('f').read()))")
        assert r.ok and r.output == f"{i} {i}", (i, r.output)
    sess.fork("long", "long-b", 118)
    assert sess.run_session("long-b", "print(x)").output == "117"
    sess.fork("long", "long-old", 5)
    r = sess.run_session("long-old", "print('x' in globals())")
    assert "session_snapshots" in r.output and r.output.endswith("False"), r.output
    # the code keeps its own process slots whatever the snapshots hold
    r = sess.run_session("long", "import os\nkids = []\nfor _ in range(40):\n    pid = os.fork()\n"
                         "    if pid == 0:\n        import time; time.sleep(1); os._exit(0)\n    kids.append(pid)\n"
                         "for p in kids:\n    os.waitpid(p, 0)\nprint(len(kids), x)", timeout_s=15)
    assert r.output == "40 120", r.output
    for k in ("long", "long-b", "long-old"):
        sess.end(k)


def test_sessions_end_with_their_trajectories_and_leave_no_process(sess):
    sess.run_session("warm", "1")
    sess.end("warm")
    time.sleep(1.0)
    ready = _procs_in(sess._inner.uid_range)  # the pool's ready sandboxes (a root state and its runner each)
    assert ready <= 4
    for k in range(6):
        sess.run_session(f"e{k}", "import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', "
                                   "'import time; time.sleep(60)'])\nx = 1")
        sess.fork(f"e{k}", f"e{k}b", 1)
        sess.run_session(f"e{k}b", "x += 1")
    assert _procs_in(sess._inner.uid_range) > 6
    for k in range(6):
        sess.end(f"e{k}")
        sess.end(f"e{k}b")
    assert sess.live_sessions == 0
    assert _wait(lambda: _procs_in(sess._inner.uid_range) <= ready), _procs_in(sess._inner.uid_range)


def test_sixty_four_concurrent_sessions_stay_within_memory(sess):
    from concurrent.futures import ThreadPoolExecutor

    def avail():
        with open("/proc/meminfo") as f:
            return next(int(ln.split()[1]) // 1024 for ln in f if ln.startswith("MemAvailable"))

    before = avail()
    with ThreadPoolExecutor(8) as ex:
        outs = list(ex.map(lambda k: sess.run_session(f"c{k}", f"import numpy as np\na = np.zeros(2**18)\nprint({k})"),
                           range(64)))
    assert [o.output for o in outs] == [str(k) for k in range(64)]
    used = before - avail()
    assert sess.live_sessions == 64 and used < 4000, used  # 64 families, copy-on-write: well below 4 GB
    for k in range(64):
        sess.end(f"c{k}")


def test_the_number_of_live_sessions_is_bounded():
    t = PythonSessionTool(timeout_s=3, max_sessions=2, queue_timeout_s=1.0)
    try:
        assert t.run_session("1", "a = 1").ok and t.run_session("2", "a = 2").ok
        r = t.run_session("3", "a = 3")  # waits for a free slot, then says why not
        assert not r.ok and "2 python sessions are live (max_sessions)" in r.output
        t.end("1")
        assert t.run_session("3", "print(3)").output == "3"
    finally:
        t.close()


def test_sessions_fork_with_the_arpo_tree(tiny_lm, tiny_tok):
    """Through the ARPO rollout: a branch after call 1 sees the parent's state after call 1."""
    from arpo.engine.hf import HFEngine
    from arpo.rollout.arpo import ARPORollout
    from arpo.settings import AgentConfig, RolloutConfig
    from arpo.testing import hook_rollout, scripted_hook
    from arpo.tools import ToolRegistry

    tool = PythonSessionTool(timeout_s=5, memory_mb=256)
    reg = ToolRegistry([tool])
    cfg = RolloutConfig(group_size=4, initial_rollouts=1, branch_threshold=0.0, entropy_weight=0.0, entropy_tokens=2)
    ro = ARPORollout(HFEngine(tiny_lm, tiny_tok), reg, AgentConfig(max_response_tokens=300), cfg)
    script = ["<python> n = 1 </python>", "<python> n += 10\nprint(n) </python>", "<answer> \\boxed{1} </answer>"]
    hook_rollout(ro, scripted_hook(tiny_tok, script, free_tokens=2))
    try:
        (tree,) = ro.run([tiny_tok.encode("q")], seed=0)
        outs = {t.traj_id: [c.output for c in t.traj.tool_calls] for t in tree.trajectories}
        for t in tree.trajectories:
            calls = t.traj.tool_calls
            assert len(calls) == 2 and calls[1].output == "11", (t.traj_id, outs)  # every path computed 1 + 10
        assert any(t.parent_id is not None for t in tree.trajectories)
        assert tool.live_sessions == 0  # ended with the rollout
        # at most the pool's ready sandboxes (a root state and its runner each)
        assert _wait(lambda: _procs_in(tool._inner.uid_range) <= 4), _procs_in(tool._inner.uid_range)
    finally:
        tool.close()


def test_no_process_is_left_after_sigint(tmp_path):
    src = os.path.dirname(os.path.dirname(__import__("arpo").__file__))
    code = textwrap.dedent(f'''
        import sys, time
        sys.path.insert(0, {src!r})
        from arpo.tools.python_session import PythonSessionTool
        t = PythonSessionTool(timeout_s=30)
        t.run_session("a", "x = 1")
        t.fork("a", "b", 1)
        print(t._inner.uid_range[0], t._inner.uid_range[1], flush=True)
        t.run_session("b", "import time; time.sleep(60)")
    ''')
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "ARPO_CACHE_DIR": str(tmp_path)})
    lo, hi = map(int, p.stdout.readline().split())
    assert _wait(lambda: _procs_in((lo, hi)) >= 2)
    p.send_signal(signal.SIGINT)
    p.wait(30)
    assert _wait(lambda: _procs_in((lo, hi)) == 0, 10), _procs_in((lo, hi))
