"""agent.tool_delivery (rollout/agent.py ready_results): which tool results join after an engine step,
and in which order — by steps and sequence ids under `step`, by completion under `arrival`."""

import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from arpo.errors import ArpoError
from arpo.rollout.agent import ready_results
from arpo.settings import AgentConfig


def done(x=None) -> Future:
    f: Future = Future()
    f.set_result(x)
    return f


def test_step_delivers_what_is_due_in_due_then_sequence_order_and_waits_for_it():
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(time.sleep, 0.05)  # not done yet: step waits for it
        a, b, later = done(), done(), done()
        pending = {a: (7, 3), slow: (2, 3), b: (5, 2), later: (1, 4)}  # future -> (sid, due step)
        got = ready_results(pending, "step", live=True, now=3)
        assert got == [b, slow, a]  # due 2 first; then due 3 by sid (2 before 7); due 4 waits
        assert slow.done()


def test_step_with_nothing_decoding_jumps_to_the_earliest_due_step():
    a, b, c = done(), done(), done()
    pending = {a: (4, 9), b: (3, 12), c: (1, 9)}
    assert ready_results(pending, "step", live=False, now=5) == [c, a]  # due 9: the earliest
    assert ready_results({b: (3, 12)}, "step", live=True, now=5) == []  # decoding on: not due yet


def test_arrival_delivers_what_is_done_whatever_the_step():
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(time.sleep, 0.2)
        a = done()
        assert ready_results({slow: (1, 0), a: (2, 9)}, "arrival", live=True, now=0) == [a]
        assert ready_results({slow: (1, 0)}, "arrival", live=False, now=0) == [slow]  # nothing decodes: wait


def test_tool_delivery_settings_are_checked_by_name():
    with pytest.raises(ArpoError, match="agent.tool_delivery: 'soon'"):
        AgentConfig(tool_delivery="soon").validate()
    with pytest.raises(ArpoError, match="agent.tool_delivery_lag"):
        AgentConfig(tool_delivery_lag=-1).validate()
