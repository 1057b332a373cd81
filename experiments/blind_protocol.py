"""The blind protocol of `arpo experiment` (issue 32, Build 2): statistics and a split ledger.

Statistics (pure functions, math in the docstrings, tests/experiments/test_blind_protocol.py checks them
against hand-computed values):

    sample_sd          s = sqrt( Σ (x_i − x̄)² / (n − 1) )                       (ddof = 1)
    percentile_interval  the (1−level)/2 and (1+level)/2 order statistics of bootstrap replicates
    bootstrap_mean_ci  percentile bootstrap of a mean over units (questions), seeded
    bootstrap_ratio_ci percentile bootstrap of Σa/Σb over paired units (the same resampled units for a and b)
    paired_counts      wins / losses / ties of arm a vs arm b per question, and the exact sign test

The ledger (`Ledger`, persisted as OUT/protocol.json) records every reported number with the split it
came from (`dev` or `test`). Settings are chosen on dev; `freeze(selection)` fixes the choice (a
dict: which checkpoint / setting per arm), and only then may a test number be recorded. Test is
reported once: recording test numbers for a different frozen selection than the one test was first
reported for is refused (ArpoError), so a rerun cannot quietly pick the setting that did best on test.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from arpo.errors import ArpoError

SPLITS = ("dev", "test")


# ---- statistics ----------------------------------------------------------------------------------
def sample_sd(xs: Sequence[float]) -> float | None:
    """Sample standard deviation, s = sqrt(Σ(x_i − x̄)² / (n − 1)) (ddof = 1); None when n < 2
    (undefined). With 3 seeds the population sd (ddof = 0) is sqrt(2/3) ≈ 0.816 of this."""
    n = len(xs)
    if n < 2:
        return None
    m = sum(xs) / n
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


def percentile_interval(replicates: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of B bootstrap replicates r_(1) ≤ … ≤ r_(B) (sorted):
    lo = r_(⌊αB/2⌋ + 1), hi = r_(⌈(1 − α/2)B⌉) with α = 1 − level (1-based order statistics), e.g.
    B = 2000, level 0.95: the 51st and the 1950th smallest."""
    if not replicates:
        raise ValueError("no bootstrap replicates")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    r = sorted(replicates)
    b, alpha = len(r), 1.0 - level
    lo = min(b - 1, int(math.floor(alpha / 2 * b + 1e-9)))
    hi = max(0, int(math.ceil((1 - alpha / 2) * b - 1e-9)) - 1)
    return r[lo], r[hi]


def resample_indices(n: int, n_resamples: int, seed: int) -> list[list[int]]:
    """`n_resamples` lists of n indices drawn uniformly with replacement from 0..n−1
    (random.Random(seed)): the same resamples for every statistic of one seed, so paired arms are
    resampled together."""
    rng = random.Random(seed)
    return [[rng.randrange(n) for _ in range(n)] for _ in range(n_resamples)]


def bootstrap_ci(units: Sequence, stat: Callable[[list], float], n_resamples: int = 2000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of stat(units): stat over `n_resamples` resamples of the units
    (with replacement, resample_indices(seed)), then percentile_interval."""
    if not units:
        raise ValueError("no units to resample")
    reps = [stat([units[i] for i in idx]) for idx in resample_indices(len(units), n_resamples, seed)]
    return percentile_interval(reps, level)


def bootstrap_mean_ci(values: Sequence[float], n_resamples: int = 2000, level: float = 0.95,
                      seed: int = 0) -> dict:
    """{mean, ci_low, ci_high, n} of the mean of per-question values (e.g. correctness 0/1, or its
    mean over seeds for one question): x̄ = Σ v_q / n, interval from resampling questions."""
    vals = [float(v) for v in values]
    lo, hi = bootstrap_ci(vals, lambda xs: sum(xs) / len(xs), n_resamples, level, seed)
    return {"mean": sum(vals) / len(vals), "ci_low": lo, "ci_high": hi, "n": len(vals),
            "level": level, "resamples": n_resamples, "seed": seed}


def bootstrap_ratio_ci(a: Sequence[float], b: Sequence[float], n_resamples: int = 2000, level: float = 0.95,
                       seed: int = 0) -> dict:
    """{ratio, ci_low, ci_high, n} of R = Σ_u a_u / Σ_u b_u over paired units u (e.g. RL steps, which
    see the same prompts in both arms): each replicate resamples the units once and uses the same
    units for a and b. A replicate with Σb = 0 is undefined: an error (it cannot happen when every
    b_u > 0)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired units needed: got {len(a)} and {len(b)} values")

    def ratio(pairs: list) -> float:
        den = sum(q for _, q in pairs)
        if den == 0:
            raise ValueError("a resample has Σb = 0; the ratio is undefined")
        return sum(p for p, _ in pairs) / den

    pairs = list(zip(map(float, a), map(float, b), strict=True))
    lo, hi = bootstrap_ci(pairs, ratio, n_resamples, level, seed)
    return {"ratio": ratio(pairs), "ci_low": lo, "ci_high": hi, "n": len(pairs), "level": level,
            "resamples": n_resamples, "seed": seed}


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided sign test of wins vs losses (ties dropped): with n = w + l and k = min(w, l),
    p = min(1, 2 · Σ_{i ≤ k} C(n, i) / 2ⁿ); 1.0 when n = 0."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def paired_counts(a: Sequence[float], b: Sequence[float]) -> dict:
    """Per question q with scores a_q, b_q (correctness, or its mean over seeds): wins = #{a_q > b_q},
    losses = #{a_q < b_q}, ties = the rest; p = sign_test_p(wins, losses)."""
    if len(a) != len(b):
        raise ValueError(f"paired questions needed: got {len(a)} and {len(b)} scores")
    wins = sum(x > y for x, y in zip(a, b, strict=True))
    losses = sum(x < y for x, y in zip(a, b, strict=True))
    return {"wins": wins, "losses": losses, "ties": len(a) - wins - losses, "p_sign_test": sign_test_p(wins, losses)}


# ---- the ledger ----------------------------------------------------------------------------------
def selection_key(selection: dict) -> str:
    """A short hash of a selection (canonical JSON), to tell two frozen selections apart."""
    return hashlib.sha256(json.dumps(selection, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Ledger:
    """Every reported number with its split, persisted as JSON at `path`.

    record(name, value, split): split is dev or test; a test number needs freeze() first. An entry
    identical to one already there (a rerun that reuses its results) is kept once.
    freeze(selection): fixes the settings chosen on dev (refused when test was already reported for
    another selection: test is reported once)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.data: dict = {"entries": [], "frozen": None, "test_reported_for": None}
        if self.path.is_file():
            self.data = json.loads(self.path.read_text())

    @property
    def frozen(self) -> dict | None:
        return self.data["frozen"]

    def freeze(self, selection: dict, reason: str = "") -> None:
        key = selection_key(selection)
        done = self.data.get("test_reported_for")
        if done is not None and done != key:
            raise ArpoError(f"{self.path}: test was already reported for another selection "
                            f"({self.data['frozen']['selection']}); a test split is reported once. Start a new "
                            "experiment directory (and a fresh test split) to choose again.")
        self.data["frozen"] = {"selection": selection, "key": key, "reason": reason}
        self._save()

    def record(self, name: str, value, split: str, **meta) -> None:
        if split not in SPLITS:
            raise ArpoError(f"ledger entry {name!r}: split must be one of {SPLITS}, got {split!r}")
        if split == "test":
            if self.frozen is None:
                raise ArpoError(f"ledger entry {name!r}: a test number before the selection is frozen; choose "
                                "the settings on dev and call freeze() first (blind protocol)")
            self.data["test_reported_for"] = self.frozen["key"]
        entry = json.loads(json.dumps({"name": name, "value": value, "split": split, **meta}, default=str))
        if entry not in self.data["entries"]:
            self.data["entries"].append(entry)
        self._save()

    def entries(self, split: str | None = None) -> list[dict]:
        return [e for e in self.data["entries"] if split is None or e["split"] == split]

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1, default=str))
