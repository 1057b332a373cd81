"""Signs that an RL run is collapsing, read off each step's metrics: named warnings, and the guard
that stops a run whose sampled policy has collapsed.

In the branch-rules studies (docs/branch_rules.md) 12 of 60 runs ended at or near zero within one to
three updates: sampled accuracy 0.69 → 0.19 → 0.00 (hop2), or the policy answering, well-formed and
wrong, after its first tool call (webhop). Each rule below is one short pure test of the step's
metrics against the run's own history (its first step and its best so far), so a run says what is
happening while it happens:

    no_signal          ≥ 90 % of the groups have one reward: almost no gradient this step
    all_malformed      every rollout is malformed (reward −1 on all): nothing to learn from
    format_rising      format errors ≥ 0.5 and ≥ 0.3 above the first step's rate
    accuracy_collapse  sampled accuracy ≤ ¼ of the run's best (which was ≥ 0.2)
    heldout_collapse   held-out pass@1 (validation.*) ≤ ¼ of the run's best (which was ≥ 0.2)
    fewer_calls        tool calls per trajectory ≤ 0.6 × the first step's: answers come sooner
    entropy_collapse   the policy's token entropy ≤ 0.2 × the first step's

all_malformed, format_rising and the two accuracy rules are collapses (COLLAPSE): with
`monitor.guard: stop` a run stops, with a checkpoint, once one of them has held for `monitor.patience`
consecutive steps (docs/training_health.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# metric name → its values so far (index 0 = the run's first logged step)
History = dict[str, list[float]]


@dataclass(frozen=True)
class Rule:
    name: str
    test: Callable[[dict, History], str | None]  # (this step's metrics, history before it) -> message or None


def _first(hist: History, key: str) -> float | None:
    vals = hist.get(key) or []
    return vals[0] if vals else None


def no_signal(m: dict, hist: History) -> str | None:
    """constant_groups ≥ 0.9: the groups whose rewards are all equal have zero advantage."""
    c = m.get("constant_groups")
    return None if c is None or c < 0.9 else f"{c:.0%} of the groups have one reward (zero advantage)"


def all_malformed(m: dict, hist: History) -> str | None:
    """format_error_rate = 1: every rollout is malformed, every reward the penalty, every advantage 0
    (it used to end as "done" without a word: 4 of 4 rollouts at −1 on the own-corpus recipe)."""
    f, n = m.get("format_error_rate"), int(m.get("trajectories", 0) or 0)
    if f is None or f < 1.0:
        return None
    return (f"all {n} rollouts are malformed (reward {m.get('reward_mean', 0):.2f} each), so every advantage is 0 "
            "and the step learned nothing; start from a model that writes the protocol (cold-start SFT: "
            "`arpo sft`), or raise agent.max_response_tokens if the answers are cut off")


def format_rising(m: dict, hist: History) -> str | None:
    """format_error_rate ≥ 0.5 and ≥ f₁ + 0.3, f₁ the first step's rate."""
    f, f1 = m.get("format_error_rate"), _first(hist, "format_error_rate")
    if f is None or f1 is None or f < 0.5 or f < f1 + 0.3:
        return None
    return f"format errors {f:.2f}, {f1:.2f} at the first step"


def accuracy_collapse(m: dict, hist: History) -> str | None:
    """acc ≤ ¼·max(acc so far), when that max ≥ 0.2 (a run that never learned has nothing to lose)."""
    a, past = m.get("accuracy"), hist.get("accuracy") or []
    best = max(past, default=0.0)
    if a is None or best < 0.2 or a > best / 4:
        return None
    return f"sampled accuracy {a:.2f}, the run's best was {best:.2f}"


def heldout_collapse(m: dict, hist: History) -> str | None:
    """The held-out pass@1 (`validation.*`, on the steps it runs) ≤ ¼ of the run's best held-out pass@1
    (which was ≥ 0.2): the greedy policy can collapse while the sampled one still scores (webhop)."""
    a, past = m.get("val/pass@1"), hist.get("val/pass@1") or []
    best = max(past, default=0.0)
    if a is None or best < 0.2 or a > best / 4:
        return None
    return f"held-out pass@1 {a:.2f}, the run's best was {best:.2f}"


def fewer_calls(m: dict, hist: History) -> str | None:
    """calls ≤ 0.6·c₁ (c₁ > 0: the first step's tool calls per trajectory): the policy answers sooner."""
    c, c1 = m.get("tool_calls_per_traj"), _first(hist, "tool_calls_per_traj")
    if c is None or not c1 or c > 0.6 * c1:
        return None
    return f"{c:.2f} tool calls per trajectory, {c1:.2f} at the first step"


def entropy_collapse(m: dict, hist: History) -> str | None:
    """H ≤ 0.2·H₁ (H: the trained tokens' mean entropy, H₁ the first step's)."""
    h, h1 = m.get("entropy"), _first(hist, "entropy")
    if h is None or not h1 or h > 0.2 * h1:
        return None
    return f"token entropy {h:.3f}, {h1:.3f} at the first step"


RULES: tuple[Rule, ...] = tuple(Rule(f.__name__, f) for f in (
    no_signal, all_malformed, format_rising, accuracy_collapse, heldout_collapse, fewer_calls, entropy_collapse))
# what the guard acts on (the other rules only warn: a run can pass through them and recover)
COLLAPSE = frozenset({"all_malformed", "format_rising", "accuracy_collapse", "heldout_collapse"})
WATCHED = ("accuracy", "format_error_rate", "tool_calls_per_traj", "entropy", "constant_groups",
           "val/pass@1")


def check(m: dict, hist: History) -> dict[str, str]:
    """The rules that fire on this step's metrics `m`, given the history before it: {name: message}."""
    return {r.name: msg for r in RULES if (msg := r.test(m, hist)) is not None}


@dataclass
class HealthMonitor:
    """Feeds each step's metrics through the rules; remembers the history and how long each collapse
    has held. `observe` adds `warn/<name>` = 1 to the metrics of a step on which a rule fired."""

    patience: int = 3  # consecutive steps a collapse must hold before `should_stop`
    history: History = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)  # collapse name → consecutive steps it has held

    def observe(self, m: dict) -> dict[str, str]:
        if m.get("skipped"):
            return {}
        fired = check(m, self.history)
        for key in WATCHED:
            if isinstance(m.get(key), (int, float)):
                self.history.setdefault(key, []).append(float(m[key]))
        self.held = {k: self.held.get(k, 0) + 1 for k in fired if k in COLLAPSE}
        m.update({f"warn/{k}": 1.0 for k in fired})
        return fired

    def should_stop(self) -> str | None:
        """The collapse that has held `patience` steps (the guard stops the run), else None."""
        return next((k for k, n in sorted(self.held.items()) if n >= self.patience), None)

