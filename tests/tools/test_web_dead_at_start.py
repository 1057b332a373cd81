"""A dead local web is found at start: `arpo eval / train / chat / serve agent` with web_search and
nothing listening at the local web's URL stop before the model loads, with one line that names the
URL and how to start it (they ran to the end, rc 0, every search an error result)."""

import json

import pytest

pytest.importorskip("httpx")

from arpo.cli import main
from arpo.ports import free_port


@pytest.fixture
def dead_url():
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def _one_line(capsys, url):
    err = capsys.readouterr().err.strip()
    assert f"the local web at {url} does not answer" in err and "arpo web serve" in err, err
    assert len(err.splitlines()) == 1, err


def test_eval_chat_and_serve_agent_refuse_a_dead_local_web(dead_url, capsys):
    web = ["--tools", "web_search,browse", "--web-url", dead_url]
    assert main(["eval", "--model", "tiny-random", "--data", "hotpotqa:dev", "--limit", "1", *web, "--quiet"]) == 2
    _one_line(capsys, dead_url)
    assert main(["chat", "--model", "tiny-random", *web, "--max-response-tokens", "4", "Who directed Ed Wood?"]) == 2
    _one_line(capsys, dead_url)
    assert main(["serve", "agent", "--model", "tiny-random", *web, "--port", str(free_port())]) == 2
    _one_line(capsys, dead_url)


def test_train_refuses_a_dead_local_web_before_the_run_dir(dead_url, tmp_path, capsys):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "Which star is the brightest?", "answer": "Sirius", "task": "qa"}) + "\n")
    assert main(["train", "model.name=tiny-random", f"data.path={data}", "tools.enabled=[web_search,browse]",
                 f"tools.web={{url: '{dead_url}'}}", "steps=1", "prompts_per_step=1", "rollout.group_size=2",
                 "rollout.initial_rollouts=1", "agent.max_response_tokens=8", f"run.dir={tmp_path / 'run'}",
                 "run.tensorboard=false", "--quiet"]) == 2
    _one_line(capsys, dead_url)
    assert not (tmp_path / "run").exists()
