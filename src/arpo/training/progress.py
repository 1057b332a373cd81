"""Progress of a long command, on stderr (stdout carries the command's result): a rich bar on a
terminal; one plain line per step when stderr is not a terminal (nohup, cluster logs), where a bar
would only appear at the end."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


def _info(metrics: dict) -> str:
    if "reward_mean" in metrics:
        return f"reward {metrics['reward_mean']:.3f} acc {metrics.get('accuracy', 0):.2f}"
    if "loss" in metrics:
        return f"loss {metrics['loss']:.4f}"
    return metrics.get("reason", "")


class Phases:
    """One line on stderr per phase before the first step's progress ("sft: loading the model X ...",
    the time since the start on each): the deep-search SFT showed nothing for its first 260 s.
    Silent when not `enabled` (--quiet)."""

    def __init__(self, name: str, enabled: bool = True, stream=None):
        self.name, self.enabled, self.stream = name, enabled, stream or sys.stderr
        self._t0 = time.perf_counter()

    def __call__(self, what: str) -> None:
        if self.enabled:
            print(f"{self.name}: {what} ({time.perf_counter() - self._t0:.0f} s)", file=self.stream, flush=True)


EVERY_S_ENV = "ARPO_PROGRESS_EVERY_S"  # seconds between heartbeat lines (default 30; 0: at every beat)


class Heartbeat:
    """A line on stderr at most every `every_s` seconds while one long part runs (an eval batch's
    generation, an SFT step's micro-batches, a training step's phases): "arpo eval hotpotqa:dev: batch
    1/2: 5/16 answers finished, 7 tool calls (elapsed 60 s)". An eval of 20 questions printed nothing
    for 54 min (progress came per finished batch), an SFT step 21.5 min under one line. `beat` takes
    the text or a function that makes it (called only when a line is due); `ticking` adds a line on a
    timer for work that has no beats of its own (one long micro-batch). Silent when not `enabled`."""

    def __init__(self, name: str, enabled: bool = True, every_s: float | None = None, stream=None):
        self.name, self.enabled, self._stream = name, enabled, stream
        self.every_s = float(os.environ.get(EVERY_S_ENV, 30)) if every_s is None else every_s
        self._t0 = self._last = time.perf_counter()
        self._lock = threading.Lock()  # the timer's thread and the caller's beats print one line at a time

    def beat(self, what: str | Callable[[], str], force: bool = False) -> None:
        with self._lock:
            now = time.perf_counter()
            if not self.enabled or (not force and now - self._last < self.every_s):
                return
            self._emit(now, what() if callable(what) else what)

    def _emit(self, now: float, text: str) -> None:
        self._last = now
        stream = self._stream or sys.stderr
        stream.write(f"{self.name}: {text} (elapsed {now - self._t0:.0f} s)\n")  # one write: no torn lines
        stream.flush()

    @contextmanager
    def ticking(self, what: Callable[[], str | None]) -> Iterator[None]:
        """While inside, a thread prints `what()` whenever this heartbeat said nothing for `every_s`
        seconds (1 s when `every_s` is 0); `what()` returns None when there is nothing to say (between
        micro-batches). A step of one micro-batch that ran 130 s printed nothing inside it."""
        if not self.enabled:
            yield
            return
        tick = self.every_s if self.every_s > 0 else 1.0
        stop = threading.Event()

        def run() -> None:
            wait = tick
            while not stop.wait(wait):
                with self._lock:
                    now = time.perf_counter()
                    wait = self._last + tick - now
                    if wait > 0:
                        continue
                    wait = tick
                    text = what()
                    if text is not None:
                        self._emit(now, text)

        thread = threading.Thread(target=run, name=f"{self.name}-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


class MicroBatches:
    """The micro-batches of a step's forward + backward, told to a Heartbeat. Called as `on_micro(done,
    of)` (training/batch.py loss_and_backward: done=0 before the first, then after each), it says each
    one done ("step 2/10: forward + backward of micro-batch 3/4 done", at most every `every_s`, and always
    after one the timer spoke of); `running` is the line for Heartbeat.ticking while one runs ("... of
    micro-batch 1/1 running for 40 s"), None between them. `step()`: the step's label ("step 2/10")."""

    def __init__(self, beat: Heartbeat, step: Callable[[], str]):
        self.beat, self.step = beat, step
        self._now: tuple[int, int, float] | None = None  # (the running one, of, its start)
        self._told = False  # the timer said the running one runs: its end is said too

    def __call__(self, done: int, of: int) -> None:
        with self.beat._lock:  # the timer's thread reads both under it
            told, self._told = self._told, False
            self._now = (done + 1, of, time.perf_counter()) if done < of else None
        if done:
            self.beat.beat(lambda: f"{self.step()}: forward + backward of micro-batch {done}/{of} done", force=told)

    def running(self) -> str | None:
        now = self._now  # called under the heartbeat's lock (Heartbeat.ticking)
        if now is None:
            return None
        i, of, t0 = now
        self._told = True
        return f"{self.step()}: forward + backward of micro-batch {i}/{of} running for {time.perf_counter() - t0:.0f} s"


# what a training step does after each of its laps (training/trainer.py train_step)
NEXT_PHASE = {"time_generation": "rollouts generated; scoring them", "time_rewards": "rewards computed",
              "time_batch": "batch built; computing the old log-probs",
              "time_old_logprobs": "old log-probs computed; forward + backward",
              "time_backward": "backward done; optimizer step", "time_optimizer": "optimizer step done"}


def step_phases(inner, beat: Heartbeat, now: dict, start: int, total: int):
    """An `on_lap(name)` for Trainer that names each phase of a step as it ends (every phase of the
    first step, later at most every `beat.every_s`), then calls `inner` (benchmarks' own)."""
    def on_lap(name: str) -> None:
        k = now["step"]
        beat.beat(lambda: f"step {k + 1}/{total}: {NEXT_PHASE.get(name, name)}", force=k == start)
        if inner is not None:
            inner(name)
    return on_lap


def generation_beat(beat: Heartbeat, total: int, group_size: int, share: str = ""):
    """An `on_generate(step, prompts, states)` for Trainer: while a step's rollouts generate, at most every
    `beat.every_s`, "step 3/10: generating, 12/32 trajectories finished, 5 tool calls" (a step whose
    generation took 23 min printed nothing until it ended). The trajectories are max(started, prompts ×
    group_size); the tool calls those the rollout ran (a branch's inherited prefix calls once, as the
    step's tool_calls_issued). `share`: said after the counts (" (rank 0's prompts)" under torchrun)."""
    seen: dict = {"of": None, "base": {}}  # the rollout's states dict -> each branch's inherited calls

    def on_generate(step: int, prompts: int, states) -> None:
        if seen["of"] is not states:  # a new rollout (a step, a dynamic-sampling round, a retried prompt)
            seen["of"], seen["base"] = states, {}
        base = seen["base"]
        if len(base) != len(states):  # a fork is made before its first call of its own: it inherits these
            for sid in states.keys() - base.keys():
                st = states[sid]
                base[sid] = len(st.calls) if getattr(st, "parent_sid", None) is not None else 0

        def line() -> str:
            done = sum(st.finish_reason is not None for st in states.values())
            calls = sum(len(st.calls) - base.get(sid, 0) for sid, st in states.items())
            n = max(len(states), prompts * group_size)
            return f"step {step + 1}/{total}: generating, {done}/{n} trajectories finished, {calls} tool calls{share}"
        beat.beat(line)
    return on_generate


class StepProgress:
    def __init__(self, name: str, total: int, start: int = 0, enabled: bool = True, stream=None):
        self.name, self.total, self.start, self.enabled = name, total, start, enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._bar: Progress | None = None
        self._t0 = time.perf_counter()

    def __enter__(self) -> StepProgress:
        if self.enabled and self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            cols = [TextColumn(self.name), BarColumn(), TextColumn("{task.completed}/{task.total} {task.fields[info]}"),
                    TimeRemainingColumn()]
            bar = Progress(*cols, console=Console(file=self.stream))
            bar.__enter__()
            self._task = bar.add_task(self.name, total=self.total, completed=self.start, info="")
            self._bar = bar
        return self

    def update(self, done: int, metrics: dict) -> None:
        if not self.enabled:
            return
        info = _info(metrics)
        if self._bar is not None:
            self._bar.update(self._task, completed=done, info=info)
            return
        el = time.perf_counter() - self._t0
        eta = el / max(done - self.start, 1) * (self.total - done)
        print(f"{self.name} step {done}/{self.total} {info} ({metrics.get('step_seconds', 0):.1f} s/step, "
              f"elapsed {el:.0f} s, eta {eta:.0f} s)", file=self.stream, flush=True)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


class Bar:
    """Progress over items (eval answers, rollout prompts, SFT rows) with rich.progress.Progress's small
    API (`add_task`, `advance`), on stderr: a rich bar on a terminal; without one, a plain line per
    task at every 10 % (and at the end) — a bar there would only appear, on stdout, at the end."""

    def __init__(self, enabled: bool = True, stream=None):
        self.enabled, self.stream = enabled, stream or sys.stderr
        self._bar: Progress | None = None
        self._tasks: dict[int, list] = {}  # id -> [label, total, done, next line at, t0]

    def __enter__(self) -> Bar:
        if self.enabled and self.stream.isatty():
            from rich.console import Console
            from rich.progress import Progress

            self._bar = Progress(console=Console(file=self.stream))
            self._bar.__enter__()
        return self

    def add_task(self, label: str, total: int) -> int:
        if self._bar is not None:
            return self._bar.add_task(label, total=total)
        tid = len(self._tasks)
        self._tasks[tid] = [label, total, 0, max(1, total // 10), time.perf_counter()]
        return tid

    def advance(self, tid: int, n: int = 1) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.advance(cast("TaskID", tid), n)  # add_task gave rich's TaskID (an int)
            return
        t = self._tasks[tid]
        t[2] += n
        label, total, done, at, t0 = t
        if done >= at or done >= total:
            el = time.perf_counter() - t0
            eta = el / max(done, 1) * max(total - done, 0)
            print(f"{label}: {done}/{total} ({100 * done / max(total, 1):.0f} %, elapsed {el:.0f} s, eta {eta:.0f} s)",
                  file=self.stream, flush=True)
            while t[3] <= done:
                t[3] += max(1, total // 10)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
