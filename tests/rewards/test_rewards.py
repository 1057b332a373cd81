"""The hierarchical reward of spec §5, checked against hand-computed values."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from arpo.errors import ArpoError
from arpo.rewards import RewardResult, arpo_reward, em_reward, f1_reward, get_reward_fn
from arpo.rewards.answer import (
    _math_verify,
    exact_match,
    extract_boxed,
    f1_score,
    math_equal,
    max_over_golds,
    normalize_answer,
)
from arpo.rewards.format import check_format, tool_calls_in

GOOD = ("<think> 17*23 </think>\n<python>print(17*23)</python>\n<result>\n391\n</result>\n"
        "<think> done </think>\n<answer> \\boxed{391} </answer>")
BOTH = ("<think> look up, then compute </think>\n<search>population of X</search>\n<result>\nX has 390 people\n"
        "</result>\n<python>print(390+1)</python>\n<result>\n391\n</result>\n<think> ok </think>\n"
        "<answer> \\boxed{391} </answer>")
T = "<think> x </think>"
A = "<answer> \\boxed{1} </answer>"


@pytest.mark.parametrize("resp,err", [
    (GOOD, None),
    (BOTH, None),
    (T + A, None),
    (T + "<answer> so \\boxed 5 </answer>", None),
    (T + A + "<|im_end|>", None),  # EOS decoded as text is allowed after </answer>
    (T + A + "\n</s>\n", None),
    # tags inside a result or inside code are data, not protocol
    (T + "<search>q</search>\n<result>\nPage 1: <b> <answer> </think>\n</result>" + A, None),
    (T + "<python>s='<think> <search>'</python>\n<result>\n\n</result>" + A, None),
    (A, "no <think> block"),
    ("<think> x " + A, "unbalanced <think>"),
    (T + "</think>" + A, "unbalanced <think>"),
    (T + "<think> y" + A, "unbalanced <think>"),
    (T + A + "<answer> \\boxed{2} </answer>", "expected exactly one <answer>, found 2"),
    (T + "\\boxed{1}", "expected exactly one <answer>, found 0"),
    (T + "<python>print(1)</python>" + A, "<python> call #1 not followed by <result>"),
    (T + "<search>q</search>\n<result>\nr\n</result>\n<python>print(1)</python>" + A,
     "<python> call #2 not followed by <result>"),
    (T + "<python>print(1)</python>", "<python> call #1 not followed by <result>"),
    (T + "<python>print(1)" + A, "unclosed <python>"),
    (T + "<result>1</result>" + A, "<result> that does not follow a tool call"),
    (T + "<answer> 1 </answer>", "answer has no \\boxed{}"),
    (T + "\\boxed{1} <answer> 1 </answer>", "answer has no \\boxed{}"),
    (T + "<answer> <think> y </think> \\boxed{1} </answer>", "<think> inside unclosed <answer>"),
    (T + A + " trailing words", "text after </answer>"),
    (T + A + "<python>print(2)</python>", "text after </answer>"),
])
def test_format_rules(resp, err):
    got = check_format(resp)
    if err is None:
        assert got is None
    else:
        assert got is not None and err in got, got


def test_format_tools_argument():
    assert "<search> is not an available tool" in check_format(BOTH, tools=("python",))
    calc = T + "<calc>1+1</calc>" + A
    assert check_format(calc) is None  # unknown tags are plain text by default
    assert check_format(calc, tools=("calc",)) == "<calc> call #1 not followed by <result>"
    assert tool_calls_in(BOTH) == ["search", "python"]
    assert tool_calls_in(T + "<python>s='<search>x</search>'</python>\n<result>\n\n</result>" + A) == ["python"]


@pytest.mark.parametrize("text,boxed", [
    ("\\boxed{1} and \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # the last one wins
    ("\\boxed{a{b}c}", "a{b}c"),  # nested braces
    ("\\boxed{\\text{\\{x\\}}}", "\\text{\\{x\\}}"),
    ("so \\boxed 5.", "5"),
    ("\\boxed{7} then \\boxed{trunc", "7"),  # a truncated last box is skipped
    ("no box", None),
    ("\\boxedx{1}", None),
    (None, None),
])
def test_extract_boxed(text, boxed):
    assert extract_boxed(text) == boxed


def test_f1_by_hand():
    # "the cat sat" -> [cat, sat]; "a cat sat down" -> [cat, sat, down]: P = 2/2, R = 2/3, F1 = 0.8
    assert f1_score("the cat sat", "a cat sat down") == pytest.approx(0.8)
    # [new, york, city] vs [york]: P = 1/3, R = 1, F1 = 2 * (1/3) / (4/3) = 0.5
    assert f1_score("New York City", "York") == pytest.approx(0.5)
    # [cat, cat] vs [cat]: common = 1, P = 1/2, R = 1, F1 = 2/3
    assert f1_score("cat cat", "cat") == pytest.approx(2 / 3)
    assert f1_score("Paris!", "paris") == 1.0
    assert f1_score("Berlin", "Paris") == 0.0
    assert f1_score("", "Paris") == 0.0
    assert max_over_golds(f1_score, "the cat sat", ["dog", "a cat sat down"]) == pytest.approx(0.8)
    assert max_over_golds(f1_score, "x", []) == 0.0


def test_yes_no_must_match_exactly():
    assert f1_score("yes", "no") == 0.0
    assert f1_score("yes it is", "yes") == 0.0  # would be F1 = 0.5 without the HotpotQA rule
    assert f1_score("yes", "yes it is") == 0.0
    assert f1_score("no", "no answer") == 0.0
    assert f1_score("Yes.", "yes") == 1.0


def test_normalize_and_exact_match():
    assert normalize_answer("The  Quick, brown") == "quick brown"
    assert normalize_answer("An apple a day") == "apple day"
    assert exact_match("The Cat.", "cat") == 1.0
    assert exact_match("cat sat", "cat") == 0.0


@pytest.mark.parametrize("pred,gold,eq", [
    ("0.5", "\\frac{1}{2}", True), ("1,000", "1000", True), ("$18", "18", True), ("\\$1,234.50", "1234.5", True),
    ("18 dollars", "18", True), ("18\\text{ dollars}", "18", True), ("18.0", "18", True), ("\\frac{36}{2}", "18", True),
    ("-\\frac{1}{2}", "-0.5", True), ("1/2", "0.5", True), ("50\\%", "50", True), ("90^\\circ", "90", True),
    ("x = 18", "18", True), ("\\sqrt{4}", "2", True), ("x+1", "1+x", True), ("x^2+2x+1", "(x+1)^2", True),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", True), ("\\text{(C)}", "C", True),
    ("17", "18", False), ("-3", "3", False), ("1/2", "12", False), ("2x", "2", False), ("x+1", "1", False),
    ("3pi", "3", False), ("abc", "18", False), ("", "1", False), (None, "1", False),
])
def test_math_equal(pred, gold, eq):
    assert math_equal(pred, gold) is eq


def test_math_equal_power_tower_returns_quickly():
    t = time.monotonic()  # sympy would evaluate 9^(9^(9^9)) forever with the timeouts off
    assert math_equal("9^{9^{9^9}}", "2") is False and math_equal("9^9^9", "2") is False
    assert math_equal("__import__('os').getcwd()", "1") is False  # never eval'd
    assert time.monotonic() - t < 5


def test_math_equal_off_main_thread():
    pairs = [("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"), ("\\sqrt{4}", "2"), ("x+1", "1+x"), ("1,000", "1000")]

    def job(p):
        assert threading.current_thread() is not threading.main_thread()
        return _math_verify(*p) if p[0].startswith("\\frac") else math_equal(*p)

    with ThreadPoolExecutor(4) as ex:
        # math-verify itself answers in the worker (no "signal only works in main thread" failure)
        assert list(ex.map(job, pairs * 3)) == [True] * 12
        assert not any(ex.map(lambda p: math_equal(*p), [("17", "18"), ("2x", "2")] * 3))


def _ex(answers, task):
    return {"answers": answers, "task": task}


def test_reward_math():
    r = arpo_reward(GOOD, _ex(["391"], "math"), tool_calls=[{"tool": "python"}])
    assert r == RewardResult(1.0, 1.0, True, None, "391", True)
    r = arpo_reward(GOOD.replace("{391}", "{390}"), _ex(["391"], "math"))
    assert (r.reward, r.score, r.format_ok, r.correct, r.answer) == (0.0, 0.0, True, False, "390")
    r = arpo_reward(GOOD.replace("{391}", "{\\$391.0}"), _ex(["391"], "math"))
    assert r.reward == 1.0
    # the reference's choice (F1 for math) stays available: "391.0" -> "3910" != "391"
    assert arpo_reward(GOOD.replace("{391}", "{391.0}"), _ex(["391"], "math"), math_scorer="f1").reward == 0.0
    assert arpo_reward(GOOD, {"answers": "391", "task": "math"}).reward == 1.0  # a bare string gold
    with pytest.raises(ArpoError, match="math_scorer"):
        arpo_reward(GOOD, _ex(["391"], "math"), math_scorer="nope")


def test_reward_format_penalty():
    bad = GOOD.replace("<think> 17*23 </think>\n", "").replace("<think> done </think>\n", "")
    r = arpo_reward(bad, _ex(["391"], "math"))
    assert (r.reward, r.score, r.format_ok, r.correct) == (-1.0, 0.0, False, False)
    assert r.format_error == "no <think> block" and r.answer == "391"  # logged, not scored
    assert arpo_reward(bad, _ex(["391"], "math"), format_penalty=-0.5).reward == -0.5
    assert arpo_reward(GOOD + " more", _ex(["391"], "math")).reward == -1.0


def test_multi_tool_bonus():
    ex = _ex(["391"], "math")
    both = [{"tool": "python"}, {"tool": "search", "ok": False}]  # a failed call was still made
    assert arpo_reward(GOOD, ex, tool_calls=both).reward == pytest.approx(1.1)
    objs = [SimpleNamespace(tool="search"), SimpleNamespace(tool="python")]
    assert arpo_reward(GOOD, ex, tool_calls=objs).reward == pytest.approx(1.1)
    assert arpo_reward(BOTH, ex).reward == pytest.approx(1.1)  # counted from the response's tags
    assert arpo_reward(BOTH, ex, tool_calls=[{"tool": "python"}]).reward == 1.0  # the records win
    quoted = GOOD.replace("print(17*23)", "print(17*23) # <search>x</search>")
    assert check_format(quoted) is None and arpo_reward(quoted, ex).reward == 1.0  # a quoted tag is no call
    assert arpo_reward(BOTH, ex, multi_tool_bonus=0.0).reward == 1.0
    assert arpo_reward(BOTH.replace("{391}", "{5}"), ex).reward == 0.0  # no bonus when wrong


def test_reward_qa():
    qa = T + "<answer> \\boxed{the cat sat} </answer>"
    r = arpo_reward(qa, _ex(["Dog", "a cat sat down"], "qa"))
    assert r.reward == pytest.approx(0.8) and r.score == pytest.approx(0.8) and not r.correct
    calls = [{"tool": "search"}, {"tool": "python"}]
    assert arpo_reward(qa, _ex(["a cat sat down"], "qa"), tool_calls=calls).reward == pytest.approx(0.9)
    yes = T + "<answer> \\boxed{Yes} </answer>"
    assert arpo_reward(yes, _ex(["yes"], "qa")).correct and arpo_reward(yes, _ex(["no"], "qa")).reward == 0.0
    half = T + "<answer> \\boxed{0.5} </answer>"
    assert arpo_reward(half, _ex(["\\frac{1}{2}"], "qa")).reward == 0.0  # QA scores text F1
    assert arpo_reward(half, _ex(["\\frac{1}{2}"], "qa"), task="math").reward == 1.0  # task= overrides


def test_f1_and_em_rewards():
    resp = "<answer> \\boxed{the cat sat} </answer>"  # no <think>: no format gate for these
    r = f1_reward(resp, _ex(["a cat sat down"], "qa"))
    assert r.reward == pytest.approx(0.8) and not r.format_ok and r.format_error == "no <think> block"
    assert em_reward(resp, _ex(["Cat sat", "dog"], "qa")).reward == 1.0
    assert em_reward("no answer here", _ex(["x"], "qa")).reward == 0.0


def test_get_reward_fn():
    assert get_reward_fn("arpo") is arpo_reward
    assert get_reward_fn("f1") is f1_reward and get_reward_fn("em") is em_reward
    assert get_reward_fn("arpo.testing:toy_reward")("abc", {}).reward >= 0
    assert get_reward_fn("arpo.rewards:arpo_reward") is arpo_reward
    for bad in ("nope", ":fn", "arpo.testing:"):
        with pytest.raises(ArpoError, match="unknown reward"):
            get_reward_fn(bad)
    with pytest.raises(ArpoError, match="cannot be loaded"):
        get_reward_fn("arpo.testing:missing")
    with pytest.raises(ArpoError, match="cannot be loaded"):
        get_reward_fn("arpo_no_such_module:fn")
    with pytest.raises(ArpoError, match="not callable"):
        get_reward_fn("arpo.rewards:MATH_SCORERS")
