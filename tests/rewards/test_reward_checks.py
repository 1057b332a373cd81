"""A reward's start check (rewards/custom.py check_reward) (issue 42 item 8: what a newcomer's first tries
found; each test failed before its fix)."""

from __future__ import annotations


def test_a_reward_returning_inf_or_nan_fails_its_start_check_by_name(tmp_path, monkeypatch):
    """A reward returning `inf` passed the start check and killed the step."""
    import pytest

    from arpo.errors import ArpoError
    from arpo.rewards import get_reward_fn
    from arpo.rewards.custom import check_reward
    from arpo.rewards.result import RewardResult

    (tmp_path / "bad_rewards.py").write_text(
        "from arpo.rewards.result import RewardResult\n"
        "def inf(response, example):\n    return float('inf')\n"
        "def minus_inf(response, example):\n    return {'reward': 0.5, 'score': float('-inf')}\n"
        "def nan(response, example):\n    return float('nan')\n"
        "def own(response, example):\n    return RewardResult(float('inf'), 1.0, True, None, None, True)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ex = [{"id": "a", "question": "1+1?", "answers": ["2"], "task": "math"}]
    for name in ("inf", "minus_inf", "nan", "own"):
        spec = f"bad_rewards:{name}"
        with pytest.raises(ArpoError, match=rf"reward '?bad_rewards:{name}\b.*(inf|nan)"):
            check_reward(get_reward_fn(spec), ex, name=spec)
    check_reward(lambda r, e, **k: RewardResult(1.0, 1.0, True, None, None, True), ex)  # finite: fine
