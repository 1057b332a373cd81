"""An environment as a tool with sessions (tools/base.py SessionTool): the agent loop, every branch
rule, the viewer and `arpo eval` drive it like the python session tool.

* a trajectory's episode is the task of its example (`bind(key, example)`: the row's `env.reset`); it
  opens at the trajectory's first call: reset(task), whose observation must be the row's question
  (the prompt the model read), then every call is an action: `<env> action </env>` → step(action),
  the observation is the result;
* each result carries the step's reward and done in `ToolResult.meta` (`env_reward`, `env_done`),
  kept on the call records, so the `env` reward (rewards/env.py) sums what the environment paid;
* a fork after call n (ARPO branches after a tool result) continues the parent's episode as it was
  after its n-th action: from the episode's snapshot when it offers one, else by replaying the n
  actions in a fresh episode at the fork's first call, checking every observation (envs/base.py);
* contract breaks (unreachable, malformed answers, a final step without reward, a replay that
  diverges) come back as an error result with `meta["env_error"]`, which the `env` reward raises as a
  one-line error: the step fails clearly instead of training on them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from arpo.envs.base import EnvError, Environment, Episode, Step, as_step
from arpo.envs.spec import load_env, parse
from arpo.errors import ArpoError
from arpo.tools.base import ToolResult

ON_MISMATCH = ("error", "skip")


def env_tool(spec: str) -> EnvTool:
    """The EnvTool a tools spec names (`env:module.path:Name`, `openenv:URL|module:app`, envs/spec.py)."""
    _, _, opts = parse(spec)
    return EnvTool(load_env(spec), tag=opts.get("tag", "env"), on_mismatch=opts.get("on_mismatch", "error"))


@dataclass
class _Session:
    task: dict  # the reset keyword arguments (the row's env.reset)
    prompt: str | None  # the first observation the row holds: reset must give it again
    episode: Episode | None = None
    history: list[tuple[str, Step]] = field(default_factory=list)  # the actions run and what they gave
    snapshots: dict[int, Any] = field(default_factory=dict)  # actions run -> the episode's snapshot then
    replay: list[tuple[str, Step]] | None = None  # a fork's inherited actions, replayed at its first call
    restore_from: Any = None  # a fork's snapshot (an environment with restore)
    done: bool = False
    skipped: bool = False
    calls: list[int] = field(default_factory=list)  # actions run after each of the trajectory's <tag> calls

    def actions(self) -> list[tuple[str, Step]]:
        """The episode's actions so far (a fork not yet started: the ones it will replay)."""
        return self.history if self.replay is None else self.replay


class EnvTool:
    """The tool `<tag> action </tag>` over an Environment; `on_mismatch`: error | skip (a fork whose
    replay diverges: fail, or refuse the branch's calls and count it in stats['branches_skipped'])."""

    sessions = True
    cacheable = False  # an action's result depends on the episode, never one answer for identical calls

    def __init__(self, env: Environment, tag: str = "env", description: str | None = None,
                 on_mismatch: str = "error"):
        if on_mismatch not in ON_MISMATCH:
            raise ArpoError(f"on_mismatch={on_mismatch!r}; use one of {', '.join(ON_MISMATCH)}")
        self.env, self.name, self.on_mismatch = env, tag, on_mismatch
        self.description = description or (f"act in the environment {env.name}: the input is your action, the "
                                            "result is what you observe")
        self.schema = {"type": "function", "function": {
            "name": tag, "description": self.description,
            "parameters": {"type": "object", "required": ["action"],
                           "properties": {"action": {"type": "string"}}}}}
        self.single_string_arg = "action"
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self.stats = {"episodes": 0, "steps": 0, "forks": 0, "replays": 0, "replayed_actions": 0, "restores": 0,
                      "branches_skipped": 0}

    def __call__(self, input: str) -> ToolResult:  # no trajectory: nothing to act in
        return ToolResult(f"Error: <{self.name}> acts in an episode; it needs the agent loop's sessions", ok=False)

    # ---- sessions (the rollout's events) ------------------------------------------------------------
    def bind(self, key: str, example: dict) -> None:
        """Trajectory `key` plays `example`'s task (its `env.reset`); its question is the first observation."""
        env = example.get("env")
        task = env.get("reset", {}) if isinstance(env, dict) else None
        if not isinstance(task, dict):
            return  # not an environment's row: its calls say so
        with self._lock:
            self._sessions[str(key)] = _Session(dict(task), example.get("question"))

    def fork(self, parent: str, child: str, n_calls: int) -> None:
        with self._lock:
            p = self._sessions.get(str(parent))
            if p is None:
                return
            # the trajectory's n-th call may have been refused before it reached the episode (an empty
            # <tag></tag>): count actions, not calls
            n = p.calls[n_calls - 1] if 0 < n_calls <= len(p.calls) else min(n_calls, len(p.actions()))
            hist = list(p.actions()[:n])
            c = _Session(p.task, p.prompt, history=[], done=bool(hist and hist[-1][1].done), calls=p.calls[:n_calls])
            if len(hist) in p.snapshots and hasattr(self.env, "restore"):
                c.restore_from, c.history = p.snapshots[len(hist)], hist
            else:
                c.replay = hist
            self._sessions[str(child)] = c
            self.stats["forks"] += 1

    def end(self, key: str) -> None:
        with self._lock:
            s = self._sessions.pop(str(key), None)
        if s is not None and s.episode is not None:
            s.episode.close()

    def close(self) -> None:
        """End the open episodes; the environment (a server the data shares) stops when arpo exits."""
        for k in list(self._sessions):
            self.end(k)

    # ---- one action ---------------------------------------------------------------------------------
    def refused(self, key: str) -> None:
        """The registry refused one of the trajectory's calls (malformed): it counts, no action ran."""
        self._count_call(str(key))

    def _count_call(self, key: str) -> None:
        s = self._sessions.get(key)
        if s is not None:
            s.calls.append(len(s.actions()))

    def run_session(self, key: str, action: str) -> ToolResult:
        try:
            return self._act(str(key), action)
        except EnvError as e:
            return ToolResult(f"Error: {e}", ok=False, meta={"env_error": str(e)})
        except Exception as e:  # noqa: BLE001 - the environment's own code: one line, and the step fails
            msg = f"environment {self.env.name} raised {type(e).__name__}: {e}"
            return ToolResult(f"Error: {msg}", ok=False, meta={"env_error": msg})
        finally:
            self._count_call(str(key))

    def _act(self, key: str, action: str) -> ToolResult:
        s = self._sessions.get(key)
        if s is None:
            raise EnvError(f"environment {self.env.name}: trajectory {key} has no task (its example has no `env` "
                           "field: train on the rows of an env:/openenv: data spec)")
        if s.skipped:
            return ToolResult("Error: this branch was skipped (the environment did not replay)", ok=False,
                              meta={"env_skipped": True})
        if s.episode is None:
            self._start(s)
            if s.skipped:
                return self._act(key, action)
        if s.done:
            return ToolResult("Error: the episode is over; give your final answer", ok=False, meta={"env_done": True})
        step = self._step(s, action)
        return ToolResult(step.observation, meta={"env_reward": step.reward, "env_done": step.done})

    def _step(self, s: _Session, action: str) -> Step:
        assert s.episode is not None
        step = as_step(s.episode.step(action), f"environment {self.env.name}: step")
        s.history.append((action, step))
        s.done = step.done
        self.stats["steps"] += 1
        self._snapshot(s)
        if step.done and step.reward is None:
            raise EnvError(f"environment {self.env.name} ended the episode (done) without a reward: an environment "
                           "trained on must pay a reward, at least at the end")
        return step

    def _snapshot(self, s: _Session) -> None:
        snap = getattr(s.episode, "snapshot", None)
        if snap is not None and hasattr(self.env, "restore"):
            s.snapshots[len(s.history)] = snap()

    def _start(self, s: _Session) -> None:
        """Open the trajectory's episode: restored from a snapshot, or reset and (a fork) replayed."""
        self.stats["episodes"] += 1
        if s.restore_from is not None:
            s.episode = self.env.restore(s.restore_from)  # type: ignore[attr-defined]
            self.stats["restores"] += 1
            return
        s.episode = self.env.open()
        first = as_step(s.episode.reset(**s.task), f"environment {self.env.name}: reset({s.task})")
        if s.prompt is not None and first.observation.strip() != s.prompt.strip():
            self._diverged(s, f"reset({s.task}) gave a first observation that is not the question the model was "
                              f"asked ({first.observation.strip()[:60]!r} vs {s.prompt.strip()[:60]!r})")
            return
        self._snapshot(s)
        replay, s.replay = s.replay or [], None
        for i, (action, want) in enumerate(replay, 1):
            got = self._step(s, action)
            if got.observation != want.observation or got.done != want.done:
                self._diverged(s, f"replaying action {i} of {len(replay)} ({action[:40]!r}) of a branch gave "
                                  f"{got.observation[:60]!r}, the parent saw {want.observation[:60]!r}")
                return
        if replay:
            self.stats["replays"] += 1
            self.stats["replayed_actions"] += len(replay)

    def _diverged(self, s: _Session, what: str) -> None:
        msg = (f"environment {self.env.name} is not deterministic: {what}; give it snapshot/restore "
               "(docs/environments.md) or set on_mismatch=skip")
        if self.on_mismatch == "error":
            raise EnvError(msg)
        s.skipped = True
        self.stats["branches_skipped"] += 1
