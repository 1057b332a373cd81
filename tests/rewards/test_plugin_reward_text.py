"""Plug-in rewards receive the model's own text (issue 37): a reward that looks for the gold in its
`response` used to credit an answer a TOOL printed. Real trajectories (HF engine, agent loop, the real
python tool computing the gold), scored through score_trees by plug-in rewards loaded by name."""

import textwrap

import pytest

from arpo.engine.hf import HFEngine
from arpo.rewards import get_reward_fn, score_trees
from arpo.rewards.custom import check_reward
from arpo.rollout.agent import AgentLoop
from arpo.rollout.tree import RolloutTree, TreeTrajectory
from arpo.settings import AgentConfig
from arpo.testing import scripted_hook
from arpo.tools.registry import ToolRegistry

PLUGIN = textwrap.dedent('''
    def naive(response, example):
        """1 when a gold answer appears anywhere in the response (the unsafe habit)."""
        return float(any(str(g) in response for g in example["answers"]))

    def trl_style(prompts, completions, answers, **kw):
        return [float(any(str(g) in c for g in a)) for c, a in zip(completions, answers)]

    def wants_raw(response, example, raw_response, tool_spans=None):
        """Asks for the whole response: may credit what a tool printed, knowingly."""
        return {"reward": float(any(str(g) in raw_response for g in example["answers"])),
                "format_ok": "<result>" not in response}
''')


@pytest.fixture()
def plugin(tmp_path, monkeypatch):
    (tmp_path / "plugin_rewards_37.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return lambda name: get_reward_fn(f"plugin_rewards_37:{name}")


@pytest.fixture(scope="module")
def tool_answered(tiny_lm, tiny_tok):
    """The model asks python for 8 * 9 (its own text never holds 72), then answers nothing useful."""
    from arpo.tools.python import PythonTool

    tool = PythonTool(timeout_s=10, pool_size=1, preimport=())
    try:
        loop = AgentLoop(HFEngine(tiny_lm, tiny_tok), ToolRegistry([tool]), AgentConfig(max_response_tokens=300))
        hook = scripted_hook(tiny_tok, ["<python>print(8 * 9)</python>", "<answer> \\boxed{I do not know} </answer>"])
        base = loop.params
        loop.params = lambda n, seed: (lambda p: (setattr(p, "logits_hook", hook), p)[1])(base(n, seed))
        (tr,) = loop.run([tiny_tok("What is 8 * 9?")["input_ids"]], seeds=[0])
    finally:
        tool.close()
    assert tr.tool_calls[0].output == "72" and "72" in tr.text and tr.finish_reason == "answer"
    return tr


def _score(tr, fn):
    tree = RolloutTree("p0", tr.prompt_ids, [TreeTrajectory(tr, 0, None, None)],
                       example={"id": "q", "question": "What is 8 * 9?", "answers": ["72"], "task": "math"})
    score_trees([tree], fn, "math_equal", ["python"])
    return tree.trajectories[0].result


def test_a_plugin_reward_no_longer_credits_what_a_tool_printed(plugin, tool_answered):
    for name in ("naive", "trl_style"):
        res = _score(tool_answered, plugin(name))
        assert res.reward == 0.0 and not res.correct, name
    # with text only (no spans: e.g. a caller that has only the response), the <result> blocks still go
    text = tool_answered.text
    assert plugin("naive")(text, {"answers": ["72"]}).reward == 0.0
    assert plugin("naive")("<answer>\\boxed{72}</answer>", {"answers": ["72"]}).reward == 1.0  # its own answer counts


def test_a_plugin_reward_can_ask_for_the_raw_response(plugin, tool_answered):
    res = _score(tool_answered, plugin("wants_raw"))
    assert res.reward == 1.0 and res.format_ok  # raw_response had the tool's 72; `response` had no <result>
    check_reward(plugin("wants_raw"), [{"id": "q", "answers": ["4"], "task": "math"}])  # the check call passes too
