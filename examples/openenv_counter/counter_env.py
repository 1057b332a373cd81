"""Reach a target by adding digits: a multi-step OpenEnv environment server (openenv-core's create_app).

reset(seed) picks the start S = 7 * seed mod 25 and the target T = S + 10 + (13 * seed) mod 21 (10 to 30
above the start: 2 to 4 additions; 525 distinct tasks, one per seed mod 525). Each step adds the
action's number when it is a whole number from 1 to 9; anything else is an error observation, the
episode goes on, and it counts in the state's `errors`. The episode ends when the total reaches T:
reward 1 for exactly T, 0 for going past it. Deterministic (the same seed and actions give the same
observations), so ARPO's forks replay it (docs/environments.md). arpo caps the calls (max_tool_calls).

Served by arpo as `openenv:examples.openenv_counter.counter_env:app` (from the repository root), or by
hand: `uvicorn examples.openenv_counter.counter_env:app --port 8000` and `openenv:http://127.0.0.1:8000`.
"""

from __future__ import annotations

from openenv.core.env_server import Environment, create_app
from openenv.core.env_server.types import Action, Observation, State

LOW, HIGH = 10, 30  # how far the target is above the start
STARTS = 25  # the starts 0..24


def task(seed: int) -> tuple[int, int]:
    """(start S, target T) of a seed: S = 7 s mod 25, T = S + 10 + (13 s mod 21). 21 and 25 are coprime, so
    the 525 seeds of a residue class mod 525 are 525 distinct tasks."""
    start = (7 * seed) % STARTS
    return start, start + LOW + (13 * seed) % (HIGH - LOW + 1)


def prompt(start: int, t: int) -> str:
    return (f"Reach exactly {t} by adding whole numbers from 1 to 9, one per <env> call: write <env> N </env>. "
            f"The total starts at {start}. When it is {t}, answer <answer> \\boxed{{{t}}} </answer>.")


class AddAction(Action):
    number: str  # the text the model wrote between <env> and </env>


class CountObservation(Observation):
    text: str


class CounterEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # one episode per WebSocket session, many at once

    def __init__(self) -> None:
        super().__init__()
        self.target, self.total, self.steps, self.errors = 0, 0, 0, 0

    def reset(self, seed=None, episode_id=None, **kw) -> CountObservation:
        start, self.target = task(int(seed or 0))
        self.total, self.steps, self.errors = start, 0, 0
        return CountObservation(text=prompt(start, self.target))

    def step(self, action, timeout_s=None, **kw) -> CountObservation:
        self.steps += 1
        text = action.number.strip()
        if not (text.isdigit() and 1 <= int(text) <= 9):
            self.errors += 1
            return CountObservation(text=f"Error: write one whole number from 1 to 9, not {text[:20]!r}; "
                                         f"total {self.total} (need {self.target - self.total} more)")
        self.total += int(text)
        if self.total < self.target:
            return CountObservation(text=f"total {self.total} (need {self.target - self.total} more)")
        if self.total == self.target:
            return CountObservation(text=f"total {self.total}: exactly {self.target}, done", done=True, reward=1.0)
        return CountObservation(text=f"total {self.total}: past {self.target}, failed", done=True, reward=0.0)

    @property
    def state(self) -> State:
        return State(step_count=self.steps, errors=self.errors)


app = create_app(CounterEnv, AddAction, CountObservation, env_name="openenv_counter", max_concurrent_envs=64)
