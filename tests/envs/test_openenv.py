"""OpenEnv (issue 63, item 2): a real openenv-core server process, with an environment defined here,
as a source of tasks, actions and rewards; arpo starts it, or plays it at a URL; `arpo train` and
`arpo eval` run on it; its contract breaks are one-line errors."""

import json
import socket
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("openenv.core")

from arpo.envs.base import EnvError
from arpo.envs.spec import close_all, iter_rows, load_env
from arpo.ports import free_port
from arpo.tools.plugins.env import env_tool as tool

COUNTER_ENV = textwrap.dedent('''
    """Reach a target by adding numbers, as an OpenEnv server (openenv-core's create_app)."""
    from openenv.core.env_server import Environment, create_app
    from openenv.core.env_server.types import Action, Observation, State

    class AddAction(Action):
        number: str

    class CountObservation(Observation):
        text: str

    class CounterEnv(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self.target, self.total, self.steps = 0, 0, 0

        def reset(self, seed=None, episode_id=None, **kw):
            self.target, self.total, self.steps = 5 + (seed or 0) % 7, 0, 0
            return CountObservation(text=f"Reach exactly {self.target} by adding whole numbers with <env>.")

        def step(self, action, timeout_s=None, **kw):
            self.steps += 1
            if action.number.strip() == "silent":  # a contract break: the episode ends without a reward
                return CountObservation(text="over", done=True, reward=None)
            self.total += int(action.number)
            done = self.total >= self.target
            return CountObservation(text=f"total {self.total}", done=done,
                                    reward=(1.0 if self.total == self.target else 0.0) if done else None)

        @property
        def state(self):
            return State(step_count=self.steps)

    app = create_app(CounterEnv, AddAction, CountObservation, env_name="counter", max_concurrent_envs=64)
    one = create_app(CounterEnv, AddAction, CountObservation, env_name="counter", max_concurrent_envs=1)
''')

SPEC = "openenv:counter_env:app"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The environment's module in a folder arpo runs in (the server process imports it from there)."""
    d = tmp_path_factory.mktemp("openenv")
    (d / "counter_env.py").write_text(COUNTER_ENV)
    mp = pytest.MonkeyPatch()
    mp.chdir(d)
    mp.syspath_prepend(str(d))
    yield d
    close_all()
    mp.undo()


def test_arpo_starts_the_server_and_a_fork_replays_over_it(served):
    rows = [r for _, r in iter_rows(SPEC + "?n=3&seed=1")]
    assert [r["question"] for r in rows][:2] == ["Reach exactly 6 by adding whole numbers with <env>.",
                                                 "Reach exactly 7 by adding whole numbers with <env>."]
    env = load_env(SPEC)
    assert env.proc is not None and env.proc.poll() is None and env.field == "number"
    t = tool(SPEC)
    t.bind("a", rows[0])
    assert t.run_session("a", "2").output == "total 2"
    assert t.run_session("a", "3").output == "total 5"
    t.fork("a", "b", 1)
    assert t.run_session("b", "4").meta == {"env_reward": 1.0, "env_done": True}  # 2 + 4 = 6: a's episode at call 1
    assert t.stats["replays"] == 1
    t.bind("s", rows[0])
    assert "ended the episode (done) without a reward" in t.run_session("s", "silent").meta["env_error"]
    assert t.run_session("a", "x").output.startswith("Error: ")  # a bad action: the model reads why
    t.close()
    # the same server at its URL
    url_rows = [r for _, r in iter_rows(f"openenv:{env.url}?n=1&seed=1")]
    assert url_rows[0]["question"] == rows[0]["question"]


def test_a_server_at_capacity_is_one_line_naming_its_limit(served):
    """More episodes at once than the server's max_concurrent_envs: an eval of 100 tasks at batch 100 on a
    64-session server failed with a bare 'raised ConnectionClosedOK: received 1000 (OK)'."""
    env = load_env("openenv:counter_env:one")
    first = env.open()
    try:
        assert first.reset(seed=0).observation.startswith("Reach exactly 5")
        second = env.open()
        with pytest.raises(EnvError, match=r"refused an episode .*max_concurrent_envs=N.*--batch-size"):
            second.reset(seed=1)
        second.close()
    finally:
        first.close()
        close_all()


def test_unreachable_and_malformed_servers_are_one_line(tmp_path):
    port = free_port()
    with pytest.raises(EnvError, match=f"cannot reach the OpenEnv server at http://127.0.0.1:{port}"):
        next(iter_rows(f"openenv:http://127.0.0.1:{port}?n=1"))
    # a server that speaks WebSocket but answers with something that is not JSON
    port = free_port()
    src = ("import asyncio, websockets\n"
           "async def h(ws):\n    async for m in ws:\n        await ws.send('<html>oops')\n"
           f"async def main():\n    async with websockets.serve(h, '127.0.0.1', {port}):\n"
           "        await asyncio.Future()\nasyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, "-c", src])
    try:
        deadline = time.monotonic() + 120
        while True:  # the server listens (a loaded machine starts python slowly)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("the websocket server did not start")
                time.sleep(0.2)
        with pytest.raises(EnvError, match="answered with malformed JSON"):
            next(iter_rows(f"openenv:http://127.0.0.1:{port}?n=1&field=number"))
    finally:
        proc.terminate()
        proc.wait(10)


def test_train_and_eval_one_step_on_an_openenv_server(served, tmp_path, scripted_training, monkeypatch):
    from arpo.cli import main
    from arpo.rollout.agent import AgentLoop
    from arpo.testing import save_tiny_model, scripted_hook

    model = save_tiny_model(tmp_path / "model")
    data = SPEC + "?n=2"
    script = ["<env> 2 </env>", "<env> 3 </env>", "<answer> \\boxed{5} </answer>"]  # seed 0: target 5
    ov = {"model.name": model, "data.path": data, "tools.enabled": f'["{SPEC}"]', "reward.fn": "env",
          "agent.max_response_tokens": 120, "rollout.group_size": 4, "rollout.initial_rollouts": 2,
          "steps": 1, "prompts_per_step": 2, "run.dir": tmp_path / "run", "run.save_every": 0,
          "run.tensorboard": "false", "run.seed": 1, "run.threads": 1}
    scripted_training(ov, script, free_tokens=2)
    m = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = [x for x in m if "reward_mean" in x][-1]
    assert step["reward_mean"] == pytest.approx(0.5)  # target 5 reached exactly: 1; target 6 never reached: 0

    base = AgentLoop.params  # arpo eval with the same scripted agent

    def params(self, n, seed):
        p = base(self, n, seed)
        p.logits_hook = scripted_hook(self.tok, script)
        return p

    monkeypatch.setattr(AgentLoop, "params", params)
    out = tmp_path / "ev.json"
    assert main(["eval", "--model", model, "--data", data, "--tools", SPEC, "--reward", "env",
                 "--max-response-tokens", "120", "--device", "cpu", "--out", str(out), "--quiet"]) == 0
    r = json.loads(out.read_text())["results"][data]
    assert r["pass@1"] == pytest.approx(0.5) and r["tool_calls"] == pytest.approx(2.0)
