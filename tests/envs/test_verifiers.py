"""verifiers environments (envs/verifiers.py): real verifiers 0.4.0 tasksets, defined here, played by
the worker in verifiers' own venv; `arpo eval` on a single-turn one and a tool one, one `arpo train`
step on the tool one, rewards from the tasks' own rubrics.

The venv is separate (verifiers pins mcp 2.0.0, openai<3...): these tests skip without it. Run:

    scripts/install_verifiers.sh && .venv/bin/python -m pytest -q tests/envs/test_verifiers.py
"""

import json
import os
import textwrap
from pathlib import Path

import pytest

from arpo.errors import ArpoError

ROOT = Path(__file__).resolve().parents[2]
HAS_VENV = bool(os.environ.get("ARPO_VERIFIERS_PYTHON")) or (ROOT / ".venv-verifiers" / "bin" / "python").exists()
needs_venv = pytest.mark.skipif(not HAS_VENV and not os.environ.get("ARPO_TEST_VERIFIERS"),  # CI: fail, not skip
                                reason="no .venv-verifiers: run scripts/install_verifiers.sh")

# A single-turn environment: the rubric pays 1 for the right number in the reply and 0.5 for a \boxed{}.
ADD_ENV = textwrap.dedent('''
    import verifiers.v1 as vf

    class AddData(vf.TaskData):
        answer: str

    class AddTask(vf.Task[AddData]):
        @vf.reward(weight=1.0)
        async def correct(self, task, trace) -> float:
            return 1.0 if task.answer in trace.last_reply else 0.0

        @vf.reward(weight=0.5)
        async def boxed(self, trace) -> float:
            return 1.0 if "\\\\boxed" in trace.last_reply else 0.0

        @vf.metric
        async def turns(self, trace) -> float:
            return float(len(trace.messages))

    class AddTaskset(vf.Taskset[AddTask]):
        def load(self):
            for a in range(6):
                yield AddTask(AddData(prompt=f"What is {a} + 2?", system_prompt="Answer with a number.",
                                      answer=str(a + 2)))

    __all__ = ["AddTaskset"]
''')

# A tool environment: a counter toolset whose total lives in the rollout's State; reward 1 when the
# total is the task's target.
COUNT_ENV = textwrap.dedent('''
    import verifiers.v1 as vf

    class CountState(vf.State):
        total: int = 0

    class Counter(vf.Toolset[vf.ToolsetConfig, CountState]):
        @vf.tool
        def add(self, n: int) -> str:
            """Add n to the counter; returns the new total."""
            self.state.total += n
            return f"total={self.state.total}"

    class CountData(vf.TaskData):
        target: int

    class CountTask(vf.Task[CountData, CountState]):
        @classmethod
        def toolsets(cls, config):
            return [Counter(vf.ToolsetConfig())]

        @vf.reward
        async def hit(self, task, trace) -> float:
            return 1.0 if trace.state.total == task.target else 0.0

    class CountTaskset(vf.Taskset[CountTask]):
        def load(self):
            for t in (5, 6, 7):
                yield CountTask(CountData(prompt=f"Reach {t} with the add tool.", target=t))

    __all__ = ["CountTaskset"]
''')


# A tool that takes its time: the worker's request limit (timeout_s) stops it.
SLOW_ENV = textwrap.dedent('''
    import time
    import verifiers.v1 as vf

    class Clock(vf.Toolset[vf.ToolsetConfig]):
        TOOL_PREFIX = None

        @vf.tool
        def wait(self, s: float) -> str:
            """Wait s seconds."""
            time.sleep(s)
            return "waited"

    class SlowTask(vf.Task[vf.TaskData]):
        @classmethod
        def toolsets(cls, config):
            return [Clock(vf.ToolsetConfig())]

    class SlowTaskset(vf.Taskset[SlowTask]):
        def load(self):
            yield SlowTask(vf.TaskData(prompt="Wait."))

    __all__ = ["SlowTaskset"]
''')


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    """The environments' modules in the folder arpo runs in (the worker imports them from there)."""
    from arpo.envs import verifiers

    d = tmp_path_factory.mktemp("vf")
    (d / "vf_add.py").write_text(ADD_ENV)
    (d / "vf_count.py").write_text(COUNT_ENV)
    (d / "vf_slow.py").write_text(SLOW_ENV)
    mp = pytest.MonkeyPatch()
    mp.chdir(d)
    yield d
    for w in verifiers._WORKERS.values():
        w.close()
    verifiers._WORKERS.clear()
    mp.undo()


def test_a_missing_venv_and_a_bad_spec_are_one_line(monkeypatch, tmp_path):
    from arpo.envs import verifiers

    monkeypatch.setenv("ARPO_VERIFIERS_PYTHON", str(tmp_path / "nope" / "python"))
    with pytest.raises(ArpoError, match=r"scripts/install_verifiers.sh") as e:
        verifiers.worker("vf_add", {})
    assert "\n" not in str(e.value)
    with pytest.raises(ArpoError, match=r"vf:TASKSET\[\?n=N"):
        verifiers.parse("vf:vf_add?n=0")


@needs_venv
def test_rows_tools_forks_and_the_rubric(envs):
    from arpo.envs.verifiers import iter_rows
    from arpo.rewards.env import vf_reward
    from arpo.tools.plugins.verifiers import vf_tools

    rows = [r for _, r in iter_rows("vf:vf_add?n=2&skip=3")]
    assert [r["question"] for r in rows] == ["Answer with a number.\n\nWhat is 3 + 2?",
                                             "Answer with a number.\n\nWhat is 4 + 2?"]
    assert rows[0]["vf"]["idx"] == 3 and rows[0]["answers"] == ["5"]
    # the rubric: correct (weight 1) + boxed (weight 0.5), by hand
    assert vf_reward("<answer> \\boxed{5} </answer>", rows[0]).reward == pytest.approx(1.5)
    assert vf_reward("<answer> \\boxed{7} </answer>", rows[0]).reward == pytest.approx(0.5)
    assert vf_reward("it is 5", rows[0]).reward == pytest.approx(1.0)
    metrics = vf_reward.pop_metrics()
    assert metrics["vf/correct"] == pytest.approx(2 / 3) and metrics["vf/boxed"] == pytest.approx(2 / 3)
    assert metrics["vf/turns"] == pytest.approx(3.0)  # system, user, assistant
    assert vf_reward.pop_metrics() == {}

    (tool,) = vf_tools("vf:vf_count")
    assert tool.name == "counter_add" and tool.parameters["required"] == ["n"]
    (row,) = [r for _, r in iter_rows("vf:vf_count?n=1")]  # target 5
    tool.bind("a", row)
    r1, r2 = tool.run_session("a", '{"n": 2}'), tool.run_session("a", '{"n": 2}')
    assert (r1.output, r2.output) == ("total=2", "total=4")
    bad = tool.run_session("a", '{"n": "x"}')
    assert not bad.ok and "integer" in bad.output
    tool.fork("a", "b", 1)  # after the first call: total 2
    assert tool.run_session("b", '{"n": 3}').output == "total=5"
    assert tool.run_session("a", '{"n": 3}').output == "total=7"  # the parent goes on from its own state

    def reward(key_results):
        spans, text, calls = [], "", []
        for res in key_results:
            text += '<counter_add>{"n": 1}</counter_add>'
            block = f"<result>{res.output}</result>"
            spans.append((len(text), len(text) + len(block)))
            text += block
            calls.append({"tool": "counter_add", "ok": res.ok, "meta": res.meta})
        return vf_reward(text + "<answer> done </answer>", row, tool_calls=calls, tool_spans=spans).reward

    child = [r1, tool.run_session("b", '{"n": 0}')]  # b: total 5 (the target)
    assert reward(child) == 1.0 and reward([r1, r2]) == 0.0  # the State after the last call is scored

    # the json tool format: the registry hands over the parsed arguments
    from arpo.tools.base import ToolCall
    from arpo.tools.registry import ToolRegistry

    reg = ToolRegistry([tool])
    tool.bind("c", row)
    got = reg.run(ToolCall(tag="counter_add", input='{"n": 4}', arguments={"n": 4}, session="c"))
    assert got.ok and got.output == "total=4"


@needs_venv
def test_a_worker_that_does_not_answer_in_time_is_one_line(envs):
    from arpo.envs.verifiers import iter_rows, worker
    from arpo.tools.plugins.verifiers import vf_tools

    (tool,) = vf_tools("vf:vf_slow")
    (row,) = [r for _, r in iter_rows("vf:vf_slow?n=1")]
    tool.bind("a", row)
    w = worker("vf_slow", {})
    w.timeout_s = 1.0  # after the (slower) load
    r = tool.run_session("a", '{"s": 30}')
    assert not r.ok and "did not answer call within 1 s" in r.output and "\n" not in r.output
    assert w.proc.poll() is not None  # stopped; the next request starts a fresh worker
    w2 = worker("vf_slow", {})
    assert w2 is not w and tool.run_session("a", '{"s": 0}').output == "waited"


@needs_venv
def test_an_environment_that_cannot_load_is_one_line(envs):
    from arpo.envs.verifiers import iter_rows

    with pytest.raises(ArpoError, match=r"verifiers environment no_such_env: load failed: ModuleNotFoundError") as e:
        list(iter_rows("vf:no_such_env"))
    assert "\n" not in str(e.value)


def _eval(monkeypatch, tmp_path, model, data, tools, script):
    from arpo.cli import main
    from arpo.rollout.agent import AgentLoop
    from arpo.testing import scripted_hook

    base = AgentLoop.params

    def params(self, n, seed):
        p = base(self, n, seed)
        p.logits_hook = scripted_hook(self.tok, script)
        return p

    monkeypatch.setattr(AgentLoop, "params", params)
    out = tmp_path / "ev.json"
    assert main(["eval", "--model", model, "--data", data, "--tools", tools, "--reward", "vf",
                 "--max-response-tokens", "120", "--device", "cpu", "--out", str(out), "--quiet"]) == 0
    return json.loads(out.read_text())["results"][data]


@needs_venv
def test_eval_on_a_single_turn_environment(envs, tmp_path, monkeypatch):
    from arpo.testing import save_tiny_model

    model = save_tiny_model(tmp_path / "model")
    r = _eval(monkeypatch, tmp_path, model, "vf:vf_add?n=2", "python", ["<answer> \\boxed{3} </answer>"])
    # task 0 (2): boxed only, 0.5; task 1 (3): correct + boxed, 1.5 -> correct (score >= 1) on one of two
    assert r["pass@1"] == pytest.approx(0.5)
    assert r["reward"] == pytest.approx(1.0) and r["score"] == pytest.approx(0.75)  # score: reward clipped to [0, 1]


@needs_venv
def test_train_and_eval_one_step_on_a_tool_environment(envs, tmp_path, scripted_training, monkeypatch):
    from arpo.testing import save_tiny_model

    model = save_tiny_model(tmp_path / "model")
    data, spec = "vf:vf_count?n=2", "vf:vf_count"
    script = ['<counter_add>{"n": 2}</counter_add>', '<counter_add>{"n": 3}</counter_add>',
              "<answer> \\boxed{5} </answer>"]  # total 5: task 0's target (5), not task 1's (6)
    ov = {"model.name": model, "data.path": data, "tools.enabled": f'["{spec}"]', "reward.fn": "vf",
          "agent.max_response_tokens": 120, "rollout.group_size": 4, "rollout.initial_rollouts": 2,
          "steps": 1, "prompts_per_step": 2, "run.dir": tmp_path / "run", "run.save_every": 0,
          "run.tensorboard": "false", "run.seed": 1, "run.threads": 1}
    scripted_training(ov, script, free_tokens=2)
    m = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = [x for x in m if "reward_mean" in x][-1]
    assert step["reward_mean"] == pytest.approx(0.5)  # the rubric's hit: 1 on task 0, 0 on task 1
    assert step["vf/hit"] == pytest.approx(0.5)

    r = _eval(monkeypatch, tmp_path, model, data, spec, script)
    assert r["pass@1"] == pytest.approx(0.5) and r["tool_calls"] == pytest.approx(2.0)
