"""Small environments for the docs and the tests (docs/environments.md): `env:arpo.envs.toy:Counter`.

Counter: reach a target by adding numbers. reset(seed) -> "Reach T ..."; step("5") -> "total 5";
the episode ends once the total reaches T or more, paying 1 when it hits T exactly, else 0.
"""

from __future__ import annotations

import copy
import random

from arpo.envs.base import Step


class Counter:
    """Reach the target: each action is a whole number added to the total."""

    deterministic = True

    def __init__(self):
        self.target, self.total = 0, 0

    def reset(self, seed: int = 0) -> Step:
        self.target, self.total = 5 + seed % 7, 0
        return Step(f"Reach exactly {self.target}: each <env> call adds a whole number to the total (it starts "
                    "at 0). Stop once you are there.")

    def step(self, action: str) -> Step:
        try:
            n = int(action.strip())
        except ValueError:
            return Step(f"not a whole number: {action.strip()[:20]!r}; the total is {self.total}")
        self.total += n
        done = self.total >= self.target
        return Step(f"total {self.total}", (1.0 if self.total == self.target else 0.0) if done else None, done)

    def close(self) -> None:
        pass


class SnapshotCounter(Counter):
    """Counter with snapshots: a fork continues from a copy of the episode, nothing is replayed."""

    def snapshot(self) -> Counter:
        return copy.deepcopy(self)


class NoisyCounter(Counter):
    """Counter whose observations carry noise: a replay never matches (it cannot branch by replay)."""

    deterministic = False

    def step(self, action: str) -> Step:
        out = super().step(action)
        out.observation += f" (noise {random.random():.6f})"
        return out


class Silent(Counter):
    """Ends the episode without a reward: a contract break (the `env` reward raises it)."""

    def step(self, action: str) -> Step:
        out = super().step(action)
        out.reward = None
        return out
