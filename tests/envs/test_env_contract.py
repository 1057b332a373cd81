"""The environment contract (issue 63, item 1): an environment is a tool with sessions; a fork
continues the parent's episode (replayed or restored); a non-deterministic one is named."""

import pytest

from arpo.engine.hf import HFEngine
from arpo.envs.spec import ClassEnvironment, iter_rows, load_env
from arpo.envs.toy import Counter, NoisyCounter, Silent, SnapshotCounter
from arpo.errors import ArpoError
from arpo.rewards import get_reward_fn, score_trees
from arpo.rollout.arpo import ARPORollout
from arpo.settings import AgentConfig, RolloutConfig
from arpo.testing import hook_rollout, scripted_hook
from arpo.tools.plugins.env import EnvTool
from arpo.tools.registry import ToolRegistry


def example(seed=0):
    (_, row), = list(iter_rows(f"env:arpo.envs.toy:Counter?n=1&seed={seed}"))
    return row


def tool(cls, **kw):
    return EnvTool(ClassEnvironment(cls, cls.__name__), **kw)


def test_rows_are_the_resets_first_observations():
    rows = [r for _, r in iter_rows("env:arpo.envs.toy:Counter?n=3&seed=4")]
    assert [r["env"]["reset"] for r in rows] == [{"seed": 4}, {"seed": 5}, {"seed": 6}]
    assert rows[0]["question"].startswith("Reach exactly 9:")
    assert load_env("env:arpo.envs.toy:Counter") is load_env("env:arpo.envs.toy:Counter?n=2")  # one per target


@pytest.mark.parametrize("cls", [Counter, SnapshotCounter])
def test_a_fork_continues_the_same_episode_state(cls):
    t = tool(cls)
    t.bind("a", example(3))  # target 8
    assert t.run_session("a", "2").output == "total 2"
    assert t.run_session("a", "3").output == "total 5"  # the parent moves on after call 1
    t.fork("a", "b", 1)  # b branched right after a's first call
    t.fork("a", "c", 2)
    assert t.run_session("b", "4").output == "total 6"  # 2 + 4: a's first action, not its second
    assert t.run_session("c", "3").meta == {"env_reward": 1.0, "env_done": True}  # 2 + 3 + 3 = 8
    assert t.run_session("a", "1").output == "total 6"  # the parent's episode is its own
    t.fork("a", "fresh", 0)
    assert t.run_session("fresh", "1").output == "total 1"
    if cls is SnapshotCounter:
        assert t.stats["restores"] == 3 and t.stats["replays"] == 0
    else:
        assert t.stats["replays"] == 2 and t.stats["replayed_actions"] == 3 and t.stats["restores"] == 0


def test_a_fork_counts_the_calls_the_registry_refused():
    """ARPO forks after the trajectory's n-th <env> call; a malformed one (empty) never reached the
    episode, so the fork inherits the actions of the calls before it, not n actions."""
    from arpo.tools.base import ToolCall

    t = tool(Counter)
    reg = ToolRegistry([t])
    t.bind("a", example(3))
    assert reg.run(ToolCall("env", "2", session="a")).output == "total 2"
    assert not reg.run(ToolCall("env", "", error="Error: empty <env> call", session="a")).ok
    assert reg.run(ToolCall("env", "3", session="a")).output == "total 5"
    reg.fork_sessions("a", "b", [type("R", (), {"tool": "env"})()] * 2)  # after call 2 (the refused one)
    assert reg.run(ToolCall("env", "1", session="b")).output == "total 3"  # 2 + 1: one action inherited
    reg.fork_sessions("b", "c", [type("R", (), {"tool": "env"})()] * 3)  # a fork of the fork, after b's call 3
    assert reg.run(ToolCall("env", "1", session="c")).output == "total 4"


def test_a_non_deterministic_env_is_named_or_its_branch_skipped():
    t = tool(NoisyCounter)
    t.bind("a", example())
    t.run_session("a", "2")
    t.fork("a", "b", 1)
    r = t.run_session("b", "1")
    assert not r.ok and "environment NoisyCounter is not deterministic: replaying action 1 of 1" in r.output
    reward = get_reward_fn("env")
    with pytest.raises(ArpoError, match="NoisyCounter is not deterministic"):
        reward("", {"id": "x"}, tool_calls=[{"tool": "env", "meta": r.meta}])
    t = tool(NoisyCounter, on_mismatch="skip")
    t.bind("a", example())
    t.run_session("a", "2")
    t.fork("a", "b", 1)
    assert t.run_session("b", "1").meta == {"env_skipped": True} and t.stats["branches_skipped"] == 1


def test_contract_breaks_are_one_line_errors():
    t = tool(Silent)
    t.bind("a", example())  # target 5
    r = t.run_session("a", "5")
    assert "Silent ended the episode (done) without a reward" in r.meta["env_error"]
    t.bind("q", {"question": "some other prompt", "env": {"reset": {"seed": 0}}})
    assert "not the question the model was asked" in t.run_session("q", "1").output
    assert "has no task" in t.run_session("unbound", "1").output
    with pytest.raises(ArpoError, match="unknown option"):
        iter_rows("env:arpo.envs.toy:Counter?bogus=1").__next__()
    with pytest.raises(ArpoError, match=r"option timeout_s='9\?n=1' is not a float"):  # a second '?'
        load_env("env:arpo.envs.toy:Counter?timeout_s=9?n=1")


def test_arpo_branches_on_a_replayed_environment(tiny_lm, tiny_tok):
    """The real ARPO rollout forks after tool results: each fork's episode is its parent's as of the
    branch point, which its observations show; the env reward sums what the episode paid."""
    script = ["<env> 2 </env>", "<env> 3 </env>", "<env> 9 </env>", "<answer> \\boxed{done} </answer>"]
    t = tool(Counter)
    ex = example(3)  # target 8: 2, 3 -> total 5, then 9 -> 14 (done, reward 0)
    cfg = RolloutConfig(group_size=6, initial_rollouts=2, entropy_weight=0.0, branch_threshold=0.0, entropy_tokens=2)
    ro = ARPORollout(HFEngine(tiny_lm, tiny_tok), ToolRegistry([t]), AgentConfig(max_response_tokens=400), cfg)
    hook_rollout(ro, scripted_hook(tiny_tok, script, free_tokens=3))
    (tree,) = ro.run([tiny_tok("Reach 8")["input_ids"]], prompt_ids=[ex["id"]], examples=[ex])
    forks = [tr for tr in tree.trajectories if tr.parent_id is not None]
    assert forks and t.stats["replays"] >= 1
    for tr in tree.trajectories:
        outs = [c.output for c in tr.traj.tool_calls]
        # every trajectory, fork or not, sees one episode: the running total of the script's actions
        assert outs == ["total 2", "total 5", "total 14"][: len(outs)], outs
    tree.example = ex
    score_trees([tree], get_reward_fn("env"), "math_equal", ["env"])
    done = [tr for tr in tree.trajectories if len(tr.traj.tool_calls) == 3]
    assert done and all(tr.result.reward == 0.0 and tr.traj.tool_calls[-1].meta["env_done"] for tr in done)


def test_a_runs_environment_is_code_or_network_from_the_run():
    """`arpo eval --model RUN` lists (and without --trust-run-config drops) a run's environment tools as
    it does plug-in tools: the module it imports, or the server it sends actions to; arpo's own toy
    environment is not code from the run."""
    from arpo.commands.from_run import code_settings

    said = [v for _, v in code_settings({"enabled": ["env:arpo.envs.toy:Counter", "env:my_env:Game?n=3",
                                                     "openenv:my_srv:app", "openenv:http://10.0.0.2:8000?n=4"]})]
    assert said[0].startswith("imports the module my_env (the environment env:my_env:Game?n=3)")
    assert said[1].startswith("imports the module my_srv (the environment openenv:my_srv:app)")
    assert said[2].startswith("sends the model's actions to the OpenEnv server http://10.0.0.2:8000")
    assert len(said) == 3
