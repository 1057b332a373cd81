import pytest

from arpo.engine.hf import HFEngine
from arpo.rollout.agent import AgentLoop
from arpo.settings import AgentConfig
from arpo.testing import scripted_hook
from arpo.tools.base import ToolResult, format_result
from arpo.tools.registry import ToolRegistry


class Echo:
    """A deterministic stand-in tool: returns its input reversed."""

    def __init__(self, name):
        self.name = name
        self.calls = []

    def __call__(self, inp):
        self.calls.append(inp)
        return ToolResult(inp[::-1])


def run(tiny_lm, tok, segments, max_tool_calls=5, max_response_tokens=400, tools=("python", "search")):
    reg = ToolRegistry([Echo(t) for t in tools])
    eng = HFEngine(tiny_lm, tok)
    loop = AgentLoop(eng, reg, AgentConfig(max_tool_calls=max_tool_calls, max_response_tokens=max_response_tokens))
    hook = scripted_hook(tok, segments)
    p = tok("Question?")["input_ids"]
    params = loop.params(len(p), seed=0)
    params.logits_hook = hook
    sid = eng.add(p, params)
    from arpo.rollout.agent import TrajState

    states = {sid: TrajState(seg_start=len(p))}
    loop.drive(states)
    return loop.trajectory(sid, states[sid]), reg


def test_tool_round_trip_and_loss_mask(tiny_lm, tiny_tok):
    segs = ["<think> go </think> <python> abc </python>", " <search> xyz </search>", " <answer> \\boxed{1} </answer>"]
    tr, reg = run(tiny_lm, tiny_tok, segs)
    assert tr.finish_reason == "answer"
    assert [(c.tool, c.input, c.output) for c in tr.tool_calls] == [("python", "abc", "cba"), ("search", "xyz", "zyx")]
    # mask is 0 exactly on the appended result tokens, 1 on everything the model generated
    expected = [1] * len(tr.response_ids)
    for c in tr.tool_calls:
        a, b = c.result_span
        assert tiny_tok.decode(tr.response_ids[a:b]) == format_result(c.output)
        expected[a:b] = [0] * (b - a)
    assert tr.loss_mask == expected
    assert tr.n_generated_tokens == len(tr.response_ids) - sum(b - a for a, b in (c.result_span for c in tr.tool_calls))
    assert "<result>\ncba\n</result>" in tr.text and tr.text.rstrip().endswith("</answer>")
    assert tr.prompt_ids == tiny_tok("Question?")["input_ids"]  # the prompt is not part of the response


@pytest.mark.parametrize(
    "segment, error",
    [
        ("<calc> 1+1 </calc>", "unknown tool <calc>"),
        ("<python>   </python>", "empty <python>"),
        ("print(1) </python>", "without an opening <python>"),
    ],
)
def test_malformed_calls_get_error_results(tiny_lm, tiny_tok, segment, error):
    tr, reg = run(tiny_lm, tiny_tok, [segment, " <answer> \\boxed{2} </answer>"])
    assert tr.finish_reason == "answer"  # the trajectory went on after the error
    assert len(tr.tool_calls) == 1 and not tr.tool_calls[0].ok
    assert error in tr.tool_calls[0].output
    assert reg["python"].calls == []


def test_tool_call_cap_ends_trajectory(tiny_lm, tiny_tok):
    segs = ["<python> a </python>", "<python> b </python>", "<python> c </python>", "<answer> x </answer>"]
    tr, reg = run(tiny_lm, tiny_tok, segs, max_tool_calls=2)
    assert tr.finish_reason == "tool_cap"
    assert [c.input for c in tr.tool_calls] == ["a", "b"]
    assert reg["python"].calls == ["a", "b"]


def test_response_budget_ends_trajectory(tiny_lm, tiny_tok):
    tr, _ = run(tiny_lm, tiny_tok, ["<python> " + "x" * 300 + " </python>", "done"], max_response_tokens=40)
    assert tr.finish_reason == "length"
    assert len(tr.response_ids) <= 40


@pytest.mark.parametrize("delivery", ["arrival", "step"])
def test_concurrent_sequences_with_slow_tool(tiny_lm, tiny_tok, delivery):
    """Tool calls run concurrently: arrival: while one sequence waits on a slow tool, the others keep
    decoding; step: calls made at one step run together and the step waits once. All finish correctly."""
    import time

    class Slow(Echo):
        def __call__(self, inp):
            time.sleep(0.3)
            return super().__call__(inp)

    reg = ToolRegistry([Slow("python")])
    eng = HFEngine(tiny_lm, tiny_tok)
    loop = AgentLoop(eng, reg, AgentConfig(max_response_tokens=300, tool_delivery=delivery))
    from arpo.rollout.agent import TrajState

    states = {}
    for i in range(4):
        p = tiny_tok(f"Q{i}")["input_ids"]
        params = loop.params(len(p), seed=i)
        params.logits_hook = scripted_hook(tiny_tok, [f"<python> v{i} </python>", f"<answer> {i} </answer>"])
        states[eng.add(p, params)] = TrajState(seg_start=len(p))
    t = time.perf_counter()
    loop.drive(states)
    assert time.perf_counter() - t < 0.3 * 4  # the four tool calls overlapped
    for i, sid in enumerate(states):
        tr = loop.trajectory(sid, states[sid])
        assert tr.finish_reason == "answer" and tr.tool_calls[0].output == f"{i}v"
