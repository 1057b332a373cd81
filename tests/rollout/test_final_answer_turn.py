"""agent.final_answer_turn (issue 59): a call beyond max_tool_calls is not run; the model is told so
and gets one more turn to answer (Search-R1's final turn), with the notice masked like a tool result."""

from arpo.engine.hf import HFEngine
from arpo.rewards import arpo_reward
from arpo.rollout.agent import FINAL_TURN_NOTICE, AgentLoop, TrajState
from arpo.settings import AgentConfig
from arpo.testing import scripted_hook
from arpo.tools.base import ToolResult, format_result
from arpo.tools.registry import ToolRegistry


class Echo:
    name = "python"

    def __init__(self):
        self.calls = []

    def __call__(self, inp):
        self.calls.append(inp)
        return ToolResult(inp[::-1])


def run(lm, tok, segments, **agent):
    reg = ToolRegistry([Echo()])
    eng = HFEngine(lm, tok)
    loop = AgentLoop(eng, reg, AgentConfig(**{"max_response_tokens": 400, **agent}))
    p = tok("Question?")["input_ids"]
    params = loop.params(len(p), seed=0)
    params.logits_hook = scripted_hook(tok, segments)
    sid = eng.add(p, params)
    states = {sid: TrajState(seg_start=len(p))}
    loop.drive(states)
    return loop.trajectory(sid, states[sid]), reg["python"]


SEGS = ["<think> a </think><python> a </python>", "<python> b </python>", "<python> c </python>",
        "<answer> \\boxed{1} </answer>"]


def test_without_the_final_turn_the_cap_ends_the_trajectory(tiny_lm, tiny_tok):
    tr, tool = run(tiny_lm, tiny_tok, SEGS, max_tool_calls=2)
    assert tr.finish_reason == "tool_cap" and not tr.final_turn
    assert tool.calls == ["a", "b"]
    assert arpo_reward(tr.text, {"answers": ["1"], "task": "math"}, tool_spans=tr.tool_spans,
                       finish_reason=tr.finish_reason).reward == -1.0


def test_the_final_turn_answers_instead_of_being_cut(tiny_lm, tiny_tok):
    tr, tool = run(tiny_lm, tiny_tok, SEGS, max_tool_calls=2, final_answer_turn=True)
    assert tr.finish_reason == "answer" and tr.final_turn
    assert tool.calls == ["a", "b"]  # the third call was not run
    assert [c.input for c in tr.tool_calls] == ["a", "b"]  # and is no call record
    notice = format_result(FINAL_TURN_NOTICE.format(cap=2))
    assert notice in tr.text
    # the mask is 0 exactly on the two results and the notice, 1 on every generated token
    spans = [c.result_span for c in tr.tool_calls]
    n_masked = len(tr.response_ids) - sum(tr.loss_mask)
    notice_ids = len(tiny_tok.encode(notice, add_special_tokens=False))
    assert n_masked == sum(b - a for a, b in spans) + notice_ids
    assert len(tr.tool_spans) == 3 and tr.text[slice(*tr.tool_spans[2])] == notice
    # the answer after the notice is the model's: a well-formed, correct response
    res = arpo_reward(tr.text, {"answers": ["1"], "task": "math"}, tool_spans=tr.tool_spans,
                      finish_reason=tr.finish_reason)
    assert res.format_ok and res.correct and res.reward == 1.0


def test_a_call_in_the_final_turn_ends_at_the_cap(tiny_lm, tiny_tok):
    segs = SEGS[:3] + ["<python> d </python>", "<answer> \\boxed{1} </answer>"]
    tr, tool = run(tiny_lm, tiny_tok, segs, max_tool_calls=2, final_answer_turn=True)
    assert tr.finish_reason == "tool_cap" and tr.final_turn
    assert tool.calls == ["a", "b"]
    assert tr.text.count("The tool-call budget is used up") == 1


def test_max_tool_calls_zero_with_the_final_turn(tiny_lm, tiny_tok):
    tr, tool = run(tiny_lm, tiny_tok, ["<think> x </think><python> a </python>", "<answer> \\boxed{1} </answer>"],
                   max_tool_calls=0, final_answer_turn=True)
    assert tr.finish_reason == "answer" and tool.calls == [] and tr.tool_calls == []
