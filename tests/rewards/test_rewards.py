"""The hierarchical reward of spec §5, checked against hand-computed values."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from arpo.errors import ArpoError
from arpo.rewards import arpo_reward, get_reward_fn
from arpo.rewards.answer import extract_boxed, f1_score, math_equal, normalize_answer
from arpo.rewards.format import check_format

GOOD = ("<think> 17*23 </think>\n<python>print(17*23)</python>\n<result>\n391\n</result>\n"
        "<think> done </think>\n<answer> \\boxed{391} </answer>")


@pytest.mark.parametrize("resp,err", [
    (GOOD, None),
    ("<think> x </think><answer> \\boxed{1} </answer>", None),
    ("<answer> \\boxed{1} </answer>", "no <think>"),
    ("<think> x <answer> \\boxed{1} </answer>", "opened inside"),
    ("<think> x </think><answer> 1 </answer>", "no \\boxed"),
    ("<think> x </think><answer> \\boxed{1} </answer><answer> \\boxed{2} </answer>", "exactly one"),
    ("<think> x </think><python>print(1)</python><answer> \\boxed{1} </answer>", "not followed by <result>"),
    ("<think> x </think><python>print(1)<answer> \\boxed{1} </answer>", "unclosed <python>"),
    ("<think> x </think><result>1</result><answer> \\boxed{1} </answer>", "does not follow"),
    ("<think> x </think><answer> \\boxed{1} </answer> trailing", "after </answer>"),
    ("<think> x </think><search>q</search>\n<result>\nPage 1: <b>\n</result><answer> \\boxed{1} </answer>", None),
    ("<think> x </think><python>s='<think>'</python>\n<result>\n\n</result><answer> \\boxed{1} </answer>", None),
])
def test_format_rules(resp, err):
    got = check_format(resp)
    if err is None:
        assert got is None
    else:
        assert got is not None and err in got, got


def test_extract_boxed():
    assert extract_boxed("\\boxed{1} and \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_boxed("\\boxed{a{b}c}") == "a{b}c"
    assert extract_boxed("\\boxed 5") == "5"
    assert extract_boxed("no box") is None
    assert extract_boxed("\\boxed{open") is None


def test_f1_by_hand():
    # "the cat sat" -> cat sat ; "a cat sat down" -> cat sat down: P = 2/2, R = 2/3, F1 = 0.8
    assert f1_score("the cat sat", "a cat sat down") == pytest.approx(0.8)
    assert f1_score("Paris!", "paris") == 1.0
    assert f1_score("yes", "no") == 0.0 and f1_score("yes it is", "yes") == 0.0 and f1_score("Yes.", "yes") == 1.0
    assert f1_score("Berlin", "Paris") == 0.0
    assert normalize_answer("The  Quick, brown") == "quick brown"


@pytest.mark.parametrize("a,b,eq", [
    ("18", "18", True), ("18.0", "18", True), ("$18", "18", True), ("\\frac{36}{2}", "18", True),
    ("1,000", "1000", True), ("0.5", "\\frac{1}{2}", True), ("1/2", "0.5", True), ("18 dollars", "18", True),
    ("\\sqrt{4}", "2", True), ("17", "18", False), ("x+1", "1+x", True), ("abc", "18", False),
])
def test_math_equal(a, b, eq):
    assert math_equal(a, b) is eq


def test_math_equal_off_main_thread():
    with ThreadPoolExecutor(4) as ex:
        assert all(ex.map(lambda p: math_equal(*p), [("\\frac{36}{2}", "18"), ("x+1", "1+x")] * 4))


def _ex(answers, task):
    return {"answers": answers, "task": task}


def test_hierarchical_reward_values():
    r = arpo_reward(GOOD, _ex(["391"], "math"), tool_calls=[{"tool": "python"}])
    assert (r.reward, r.score, r.correct, r.format_ok, r.answer) == (1.0, 1.0, True, True, "391")
    wrong = GOOD.replace("{391}", "{390}")
    assert arpo_reward(wrong, _ex(["391"], "math")).reward == 0.0
    bad = GOOD.replace("<think> 17*23 </think>\n", "").replace("<think> done </think>\n", "")
    r = arpo_reward(bad, _ex(["391"], "math"))
    assert r.reward == -1.0 and not r.format_ok and "think" in r.format_error
    both = [{"tool": "python"}, {"tool": "search"}]
    assert arpo_reward(GOOD, _ex(["391"], "math"), tool_calls=both).reward == pytest.approx(1.1)
    qa = "<think> x </think><answer> \\boxed{the cat sat} </answer>"
    r = arpo_reward(qa, _ex(["Dog", "a cat sat down"], "qa"))
    assert r.reward == pytest.approx(0.8) and not r.correct
    assert arpo_reward(qa, _ex(["a cat sat down"], "qa"), tool_calls=both).reward == pytest.approx(0.9)
    # the reference's choice (F1 for math) stays available
    assert arpo_reward(GOOD.replace("{391}", "{391.0}"), _ex(["391"], "math"), math_scorer="f1").reward == 0.0


def test_get_reward_fn():
    assert get_reward_fn("arpo") is arpo_reward
    assert get_reward_fn("arpo.testing:toy_reward")("abc", {}).reward >= 0
    with pytest.raises(ArpoError, match="unknown reward"):
        get_reward_fn("nope")
    with pytest.raises(ArpoError, match="cannot be loaded"):
        get_reward_fn("arpo.testing:missing")
