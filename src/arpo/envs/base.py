"""The environment contract: what arpo needs from an environment to train on it.

An `Environment` opens episodes (`open() -> Episode`). An `Episode` is one run of one task:

    reset(**task) -> Step     the task's first observation: the agent's prompt (the user turn)
    step(action)  -> Step     the observation the action leads to (the tool result the model reads),
                              an optional reward (None: no reward at this step) and done
    close()                   release what the episode holds

`task` is the row's `env.reset` (e.g. {"seed": 3}): the same task must give the same first observation.

Branching (ARPO forks a trajectory after a tool result) needs the episode's state at that point:
* an episode with `snapshot() -> object` and an environment with `restore(snapshot) -> Episode` is
  continued from its snapshot (taken after every step);
* otherwise the fork opens a fresh episode, resets it with the same task and replays the actions up to
  the fork, checking that every observation matches the one the parent saw. That works for a
  deterministic environment (`deterministic = True`, the default); a mismatch is an EnvError naming the
  environment as non-deterministic (or, `on_mismatch: skip`, the branch's calls are refused and counted).
An environment that sets `deterministic = False` and offers no snapshot cannot branch: its forks fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from arpo.errors import ArpoError


class EnvError(ArpoError):
    """An environment broke the contract (unreachable, malformed answer, no reward, not replayable)."""


@dataclass
class Step:
    observation: str
    reward: float | None = None
    done: bool = False


@runtime_checkable
class Episode(Protocol):
    def reset(self, **task: Any) -> Step: ...

    def step(self, action: str) -> Step: ...

    def close(self) -> None: ...


@runtime_checkable
class Environment(Protocol):
    name: str  # for messages and the run's records
    deterministic: bool  # a task and actions give the same observations (replay can branch it)

    def open(self) -> Episode: ...


def as_step(out: Any, where: str) -> Step:
    """A Step from what an environment returned: a Step, an (observation, reward, done) tuple, a dict
    with `observation` (and `reward`, `done`), or a string (an observation without reward)."""
    if isinstance(out, Step):
        step = out
    elif isinstance(out, str):
        step = Step(out)
    elif isinstance(out, tuple) and len(out) == 3:
        step = Step(*out)
    elif isinstance(out, dict) and "observation" in out:
        step = Step(out["observation"], out.get("reward"), bool(out.get("done", False)))
    else:
        raise EnvError(f"{where} returned {type(out).__name__} {out!r:.80}; return a Step, a string, an "
                       "(observation, reward, done) tuple or a dict with 'observation'")
    if not isinstance(step.observation, str):
        step.observation = observation_text(step.observation)
    if step.reward is not None:
        try:
            step.reward = float(step.reward)
        except (TypeError, ValueError) as e:
            raise EnvError(f"{where} returned reward {step.reward!r}, not a number") from e
    step.done = bool(step.done)
    return step


def observation_text(obs: Any) -> str:
    """The text the model reads for a structured observation: its text field if it has one, else JSON."""
    import json  # noqa: PLC0415 - only for structured observations

    if isinstance(obs, dict):
        for key in ("text", "prompt", "message", "output", "observation", "echoed_message", "content"):
            if isinstance(obs.get(key), str):
                return obs[key]
    return json.dumps(obs, ensure_ascii=False, sort_keys=True, default=str)
