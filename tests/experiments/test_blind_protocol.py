"""experiments/blind_protocol.py against hand-computed values (issue 32, Build 2)."""

from __future__ import annotations

import math
import random

import pytest

from arpo.errors import ArpoError
from experiments import blind_protocol as P


def test_sample_sd_is_ddof_1():
    # mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5, / (4 - 1)
    assert P.sample_sd([1, 2, 3, 4]) == pytest.approx(math.sqrt(5 / 3))
    # issue 32's three seeds: population sd is sqrt(2/3) of the sample sd
    xs = [0.25, 0.30, 0.29]
    pop = math.sqrt(sum((x - sum(xs) / 3) ** 2 for x in xs) / 3)
    assert P.sample_sd(xs) == pytest.approx(pop / math.sqrt(2 / 3))
    assert P.sample_sd([0.3]) is None and P.sample_sd([]) is None


def test_percentile_interval_order_statistics():
    r = list(range(1, 101))
    random.Random(1).shuffle(r)
    assert P.percentile_interval(r, 0.90) == (6, 95)  # 6th and 95th smallest of 1..100
    r = list(range(1, 2001))
    random.Random(2).shuffle(r)
    assert P.percentile_interval(r, 0.95) == (51, 1950)
    assert P.percentile_interval([7.0], 0.95) == (7.0, 7.0)
    with pytest.raises(ValueError):
        P.percentile_interval([], 0.95)


def test_resamples_are_seeded_and_in_range():
    a = P.resample_indices(5, 10, seed=3)
    assert a == P.resample_indices(5, 10, seed=3) != P.resample_indices(5, 10, seed=4)
    assert len(a) == 10 and all(len(x) == 5 and all(0 <= i < 5 for i in x) for x in a)


def test_bootstrap_mean_ci_hand_cases():
    c = P.bootstrap_mean_ci([0.5, 0.5, 0.5])  # every replicate is 0.5
    assert (c["mean"], c["ci_low"], c["ci_high"], c["n"]) == (0.5, 0.5, 0.5, 3)
    # two questions, one right: a replicate is 0 (p 1/4), 0.5 (1/2) or 1 (1/4); with 2000 replicates
    # about 500 are 0 and 500 are 1, so the 51st smallest is 0 and the 1950th is 1
    c = P.bootstrap_mean_ci([0, 1], n_resamples=2000, seed=0)
    assert (c["mean"], c["ci_low"], c["ci_high"]) == (0.5, 0.0, 1.0)
    # 60 % of a large balanced set: the interval is about ±1.96 sqrt(.6 .4 / 400) = ±0.048
    c = P.bootstrap_mean_ci([1] * 240 + [0] * 160, seed=1)
    assert c["mean"] == 0.6 and 0.54 < c["ci_low"] < 0.57 and 0.63 < c["ci_high"] < 0.66


def test_bootstrap_ratio_ci_hand_cases():
    r = P.bootstrap_ratio_ci([2, 2], [1, 1])
    assert (r["ratio"], r["ci_low"], r["ci_high"]) == (2.0, 2.0, 2.0)
    # units (1, 1) and (3, 1): a replicate is 1/1 (both unit 0, p 1/4), 3 (both unit 1, p 1/4) or 4/2 = 2
    r = P.bootstrap_ratio_ci([1, 3], [1, 1], n_resamples=2000, seed=0)
    assert (r["ratio"], r["ci_low"], r["ci_high"]) == (2.0, 1.0, 3.0)
    # paired: the same units in numerator and denominator, so a constant ratio has a zero-width interval
    a, b = [3.0, 6.0, 9.0, 30.0], [1.0, 2.0, 3.0, 10.0]
    r = P.bootstrap_ratio_ci(a, b)
    assert r["ci_low"] == pytest.approx(3.0) and r["ci_high"] == pytest.approx(3.0)
    with pytest.raises(ValueError):
        P.bootstrap_ratio_ci([1, 2], [1])


def test_sign_test_and_paired_counts():
    assert P.sign_test_p(5, 0) == pytest.approx(2 / 32)
    assert P.sign_test_p(3, 1) == pytest.approx(2 * (1 + 4) / 16)
    assert P.sign_test_p(2, 2) == 1.0 and P.sign_test_p(0, 0) == 1.0
    got = P.paired_counts([1, 0, 1, 0.5, 1], [0, 0, 1, 1, 0])
    assert got == {"wins": 2, "losses": 1, "ties": 2, "p_sign_test": pytest.approx(2 * (1 + 3) / 8)}
    with pytest.raises(ValueError):
        P.paired_counts([1], [1, 0])


def test_ledger_refuses_test_before_freeze_and_a_second_selection(tmp_path):
    path = tmp_path / "protocol.json"
    led = P.Ledger(path)
    led.record("arpo/dev_accuracy", 0.4, "dev", step=10)
    with pytest.raises(ArpoError, match="before the selection is frozen"):
        led.record("arpo/test_accuracy", 0.5, "test")
    with pytest.raises(ArpoError, match="split must be"):
        led.record("x", 1, "train")
    led.freeze({"arpo": 10, "grpo": 20}, reason="best dev step")
    led.freeze({"arpo": 10, "grpo": 20})  # the same selection again: fine
    led.record("arpo/test_accuracy", 0.5, "test", step=10)
    again = P.Ledger(path)  # persisted
    assert [e["split"] for e in again.entries()] == ["dev", "test"]
    assert again.entries("test")[0]["value"] == 0.5
    with pytest.raises(ArpoError, match="reported once"):
        again.freeze({"arpo": 20, "grpo": 20})
    fresh = P.Ledger(tmp_path / "other.json")
    fresh.freeze({"arpo": 20})
    fresh.freeze({"arpo": 10})  # re-choosing on dev is allowed while no test number exists


def test_a_rerun_that_reuses_its_results_records_each_number_once(tmp_path):
    """The dev command, then `report_test=true` in the same directory: the dev numbers come out the same
    and are listed once; a changed value is a new entry (the ledger keeps what was reported)."""
    path = tmp_path / "protocol.json"
    P.Ledger(path).record("arpo/accuracy_at_selected_step", 0.7277777777777779, "dev", step=10, data="hop2:dev")
    again = P.Ledger(path)
    again.record("arpo/accuracy_at_selected_step", 0.7277777777777779, "dev", step=10, data="hop2:dev")
    assert len(P.Ledger(path).entries("dev")) == 1
    again.record("arpo/accuracy_at_selected_step", 0.75, "dev", step=10, data="hop2:dev")
    assert [e["value"] for e in P.Ledger(path).entries("dev")] == [0.7277777777777779, 0.75]
