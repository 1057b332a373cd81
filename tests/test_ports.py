"""ports.stop_process, the one way a server run as a child is stopped (web/process.py's served_web,
envs/openenv.py's local apps): SIGTERM, a grace period, then SIGKILL; the child is reaped either way."""

import signal
import subprocess
import sys

from arpo.ports import stop_process

STUBBORN = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
            "time.sleep(60)\n")


def _child(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"  # its handlers are set
    return proc


def test_a_child_that_honours_sigterm_ends_by_it():
    proc = _child("import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    stop_process(proc)
    proc.stdout.close()  # type: ignore[union-attr]
    assert proc.returncode == -signal.SIGTERM


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period():
    proc = _child(STUBBORN)
    stop_process(proc, grace_s=0.5)
    proc.stdout.close()  # type: ignore[union-attr]
    assert proc.returncode == -signal.SIGKILL


def test_an_exited_child_is_left_alone():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    stop_process(proc)
    assert proc.returncode == 0
