"""reasoning-gym (issue 63, item 4): `rg:NAME` data specs, seeded, graded by the generator's own
score_answer (partial credit); `arpo train` and `arpo eval` run on one."""

import json

import pytest

pytest.importorskip("reasoning_gym")

from arpo.data.datasets import load_examples
from arpo.errors import ArpoError
from arpo.rewards import get_reward_fn
from arpo.rewards.custom import check_reward


def test_rg_specs_are_seeded_tasks_with_their_entries():
    a = load_examples("rg:countdown?size=4&seed=1")
    assert [e["id"] for e in a] == [f"rg:countdown:1:{i}" for i in range(4)]
    assert a == load_examples("rg:countdown?size=4&seed=1")  # a seed gives the same tasks
    assert [e["question"] for e in load_examples("rg:countdown?size=4&seed=2")] != [e["question"] for e in a]
    assert load_examples("rg:countdown?size=4&seed=1[1:3]") == a[1:3]
    assert a[0]["rg"]["dataset"] == "countdown" and a[0]["task"] == "math"
    cfg = load_examples("rg:basic_arithmetic?size=3&seed=0&min_terms=2&max_terms=2")
    assert all(e["question"].count(" ") <= 4 for e in cfg)  # the generator's own config keys: two terms
    with pytest.raises(ArpoError, match="reasoning-gym cannot make it"):
        load_examples("rg:no_such_task")
    # a `+` in an option is a plus, not form encoding's space: it used to fail as "unsupported operator:  "
    plus = load_examples('rg:basic_arithmetic?size=6&seed=0&operators=["+","-"]&allow_parentheses=false')
    assert all("*" not in e["question"] and "/" not in e["question"] for e in plus)
    assert any("+" in e["question"] for e in plus)
    with pytest.raises(ArpoError, match="integer size"):
        load_examples("rg:countdown?size=zero")


def test_the_reward_is_score_answer_with_partial_credit():
    (ex,) = load_examples("rg:countdown?size=1&seed=1")
    reward = get_reward_fn("rg")
    gold = ex["rg"]["entry"]["answer"]  # 94*4 - 61 - 6 = 309
    assert reward(f"<answer>\\boxed{{{gold}}}</answer>", ex).reward == 1.0
    assert reward("<answer>\\boxed{1+2}</answer>", ex).reward == pytest.approx(0.05)  # countdown's partial credit
    assert reward("<answer>94*4 - 61 - 6</answer>", ex).correct  # an answer block without \boxed{} is read too
    assert reward("no answer at all", ex).reward == 0.0
    check_reward(reward, [ex], name="rg")  # the start-of-run check passes
    with pytest.raises(ArpoError, match="not a reasoning-gym task"):
        reward("x", {"id": "q1", "answers": ["1"]})


def test_train_and_eval_one_step_on_reasoning_gym(tmp_path, scripted_training, monkeypatch):
    from arpo.cli import main
    from arpo.rollout.agent import AgentLoop
    from arpo.testing import save_tiny_model, scripted_hook

    model = save_tiny_model(tmp_path / "model")
    data = "rg:basic_arithmetic?size=2&seed=1"
    exs = load_examples(data)
    script = [f"<answer> \\boxed{{{exs[0]['answers'][0]}}} </answer>"]  # right for the first task only
    ov = {"model.name": model, "data.path": data, "tools.enabled": "[]", "reward.fn": "rg",
          "agent.max_response_tokens": 60, "rollout.group_size": 2, "rollout.initial_rollouts": 2, "steps": 1,
          "prompts_per_step": 2, "run.dir": tmp_path / "run", "run.save_every": 0, "run.tensorboard": "false",
          "run.seed": 1, "run.threads": 1}
    scripted_training(ov, script, free_tokens=0)
    m = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    want = sum(get_reward_fn("rg")(script[0], e).reward for e in exs) / 2
    assert exs[0]["answers"] != exs[1]["answers"] and want == pytest.approx(0.5)
    assert [x for x in m if "reward_mean" in x][-1]["reward_mean"] == pytest.approx(want)

    base = AgentLoop.params

    def params(self, n, seed):
        p = base(self, n, seed)
        p.logits_hook = scripted_hook(self.tok, script)
        return p

    monkeypatch.setattr(AgentLoop, "params", params)
    out = tmp_path / "ev.json"
    assert main(["eval", "--model", model, "--data", data, "--reward", "rg", "--max-response-tokens", "60",
                 "--device", "cpu", "--out", str(out), "--quiet"]) == 0
    assert json.loads(out.read_text())["results"][data]["pass@1"] == pytest.approx(0.5)
