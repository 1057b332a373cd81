"""Stopping a long run cleanly: Ctrl-C (SIGINT) or SIGTERM (what a cluster sends before
preemption) asks the run to stop after the step in progress; the recipe then writes a checkpoint
and prints where it stopped and the command that resumes it. A second signal interrupts at once
(KeyboardInterrupt: the unfinished step is lost, the last checkpoint stays)."""

from __future__ import annotations

import shlex
import signal
import sys
import threading


class GracefulStop:
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signal: str | None = None
        self._old: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.signal is not None:  # the second one: stop now
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name
        print(f"\narpo: {self.signal} received: finishing the current step, then a checkpoint "
              "(send it again to stop at once)", file=sys.stderr, flush=True)

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():  # handlers only install there
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()

    def requested(self, multi: bool = False) -> bool:
        """Whether to stop after this step (under torchrun: if any rank was signalled, all stop)."""
        if not multi:
            return self.signal is not None
        from arpo.training import distributed  # noqa: PLC0415 - loads torch; kept out of this light module's import

        return bool(distributed.all_reduce([float(self.signal is not None)], op="max")[0])

    def report(self, what: str, done: int, total: int, run_dir) -> None:
        argv = [a for a in sys.argv[1:] if a != "--overwrite"]
        argv = argv if "--resume" in argv else argv + ["--resume"]
        # run by another command (`arpo experiment`): the run's own config resumes it (it printed a placeholder)
        cmd = shlex.join(["arpo", *argv]) if argv and argv[0] == what else \
            shlex.join(["arpo", what, "--config", f"{run_dir}/config.yaml", "--resume"])
        print(f"arpo {what}: stopped after step {done}/{total} ({self.signal or 'a stop request'}); checkpoint "
              f"written to {run_dir}/checkpoints. Resume with:\n  {cmd}", file=sys.stderr, flush=True)


class TerminateAsInterrupt:
    """SIGTERM, wherever no GracefulStop has taken it (an evaluation, a data stage, between runs), ends
    the program as Ctrl-C does: KeyboardInterrupt instead of Python's default immediate death, so that
    `finally` blocks and context managers run (a child server it started is stopped, not orphaned).
    Installed only in the main thread and only over the default handler; the old handler comes back
    on exit."""

    def __enter__(self) -> TerminateAsInterrupt:
        self._old = None
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._old = signal.signal(signal.SIGTERM, self._handle)
        return self

    @staticmethod
    def _handle(signum, frame) -> None:
        raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
