"""The local web (`arpo web serve`): HTML pages and SearXNG's JSON API over a user corpus and over the
built-in HotpotQA corpus, the command as a real process, deep-search SFT trajectories made through
the real tools on it, and `arpo chat / eval --tools web_search,browse` against it (tiny random model;
chat's text scripted so that the calls are known)."""

import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("httpx")
pytest.importorskip("trafilatura")
import httpx
from web_servers import uvicorn_app

from arpo.cli import main
from arpo.ports import free_port
from arpo.settings.web import WebConfig

ROWS = [{"id": "a", "title": "Alpha Centauri", "text": "Alpha Centauri is the closest star system to the Sun.",
         "url": "https://stars.example/systems/alpha-centauri"},
        {"id": "b", "title": "Sirius", "text": "Sirius is the brightest star in the night sky."},
        {"id": "c", "title": "Sirius", "text": "Sirius is also a character in a novel."}]


@pytest.fixture(scope="module")
def user_web(tmp_path_factory):
    from arpo.web.server import create_app
    from arpo.web.site import Site

    d = tmp_path_factory.mktemp("uweb")
    (d / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    site = Site.from_corpus([str(d / "c.jsonl")], d / "index")
    with uvicorn_app(create_app(site, per_page=2)) as url:
        yield url


@pytest.fixture(scope="module")
def hotpot_web():
    from arpo.web.server import create_app, load_site

    with uvicorn_app(create_app(load_site())) as url:
        yield url


def test_searxng_json_api_and_pages(user_web):
    r = httpx.get(f"{user_web}/search", params={"q": "brightest star", "format": "json"}).json()
    assert r["query"] == "brightest star" and r["number_of_results"] == 2 and r["pageno"] == 1
    top = r["results"][0]
    assert top["title"] == "Sirius" and top["url"] == f"{user_web}/wiki/Sirius" and "brightest" in top["content"]
    assert {"engine", "score", "category"} <= set(top) and r["answers"] == [] and r["suggestions"] == []
    p2 = httpx.get(f"{user_web}/search", params={"q": "star Sirius", "format": "json", "pageno": 2}).json()
    assert p2["pageno"] == 2 and len(p2["results"]) == 1  # 3 hits, 2 per page
    urls = {x["url"] for x in httpx.get(f"{user_web}/search", params={"q": "star Sirius Alpha", "format": "json"})
            .json()["results"] + p2["results"]}
    assert f"{user_web}/systems/alpha-centauri" in urls or f"{user_web}/wiki/Sirius_(2)" in urls
    page = httpx.get(f"{user_web}/systems/alpha-centauri")  # a row's url: its path on the local web
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<h1>Alpha Centauri</h1>" in page.text and "closest star system" in page.text
    dup = httpx.get(f"{user_web}/wiki/Sirius_(2)")  # the second page titled Sirius
    assert dup.status_code == 200 and "character in a novel" in dup.text
    html_results = httpx.get(f"{user_web}/search", params={"q": "Sirius"})
    assert html_results.status_code == 200 and "<ol>" in html_results.text
    assert httpx.get(f"{user_web}/nothing/here").status_code == 404
    assert httpx.get(f"{user_web}/search", params={"format": "json"}).status_code == 400
    assert httpx.get(f"{user_web}/health").json() == {"status": "ok", "pages": 3, "corpus": "c.jsonl"}


def test_hotpotqa_local_web_answers_the_tools(hotpot_web):
    from arpo.tools import build_tools

    reg = build_tools(["web_search", "browse"], web={"url": hotpot_web, "top_k": 3})
    s = reg["web_search"]("Ed Wood film director")
    assert s.ok and s.output.startswith(f"1. Ed Wood (film)\nURL: {hotpot_web}/wiki/Ed_Wood_(film)\n")
    b = reg["browse"](f"{s.meta['urls'][0]} | who directed it")
    assert b.ok and "Tim Burton" in b.output
    reg.close()


def test_deep_search_sft_trajectories_through_the_real_tools(hotpot_web, tmp_path):
    from arpo.data.prompts import TASK_TOOLS
    from arpo.recipes.web_sft_data import build_deep_search_sft
    from arpo.sft.rows import result_spans

    out = tmp_path / "ds.jsonl"
    stats = build_deep_search_sft("hotpotqa:train[0:30]", str(out), web={"url": hotpot_web, "top_k": 3,
                                                                          "window_chars": 600},
                                  limit=3, progress=False)
    assert stats["written"] == 3 and stats["read"] >= 3
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    for row in rows:
        r = row["response"]
        assert row["system"] == "deep_search" and TASK_TOOLS["deep_search"] == ("web_search", "browse")
        assert r.count("<web_search>") == r.count("<browse>") >= 1 and r.endswith("</answer>")
        assert f"URL: {hotpot_web}/wiki/" in r and [list(s) for s in result_spans(r)] == row["tool_results"]
        assert row["answers"][0].lower() in r.lower()


def test_arpo_web_serve_as_a_process(tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-m", "arpo", "web", "serve", "--corpus", str(tmp_path / "c.jsonl"),
                             "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, health = time.time() + 60, None
        while time.time() < deadline and health is None:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.2)
        assert health == {"status": "ok", "pages": 3, "corpus": "c.jsonl"}
        hits = httpx.get(f"http://127.0.0.1:{port}/search", params={"q": "closest star", "format": "json"}).json()
        assert hits["results"][0]["url"] == f"http://127.0.0.1:{port}/systems/alpha-centauri"
        busy = subprocess.run([sys.executable, "-m", "arpo", "web", "serve", "--corpus", str(tmp_path / "c.jsonl"),
                               "--port", str(port)], env=env, capture_output=True, text=True, timeout=60)
        assert busy.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in busy.stderr
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("fmt", ["tags", "json"])
def test_chat_calls_web_search_and_browse_on_the_local_web(hotpot_web, capsys, monkeypatch, fmt):
    """`arpo chat --tools web_search,browse` with the tiny random model whose text is scripted: both
    calls run through the real tools against the local web, in either call format."""
    from arpo.rollout.agent import AgentLoop
    from arpo.testing import scripted_hook

    page = f"{hotpot_web}/wiki/Ed_Wood_(film)"
    if fmt == "tags":
        segments = ["<web_search> Ed Wood film </web_search>", f" <browse> {page} | director </browse>",
                    " <answer> \\boxed{Tim Burton} </answer>"]
    else:
        segments = ['<tool_call>{"name": "web_search", "arguments": {"query": "Ed Wood film"}}</tool_call>',
                    '<tool_call>{"name": "browse", "arguments": ' + json.dumps({"url": page, "query": "director"})
                    + "}</tool_call>",
                    "<answer> \\boxed{Tim Burton} </answer>"]
    params = AgentLoop.params

    def scripted(self, prompt_len, seed):
        p = params(self, prompt_len, seed)
        p.logits_hook = scripted_hook(self.tok, segments)
        return p

    monkeypatch.setattr(AgentLoop, "params", scripted)
    assert main(["chat", "--model", "tiny-random", "--json", "--tools", "web_search,browse", "--tool-format", fmt,
                 "--web-url", hotpot_web, "--web-top-k", "1", "--browse-window-chars", "400",
                 "--max-response-tokens", "2000", "who directed Ed Wood?"]) == 0
    out = json.loads(capsys.readouterr().out)
    calls = out["tool_calls"]
    assert [c["tool"] for c in calls] == ["web_search", "browse"] and all(c["ok"] for c in calls)
    assert calls[0]["output"].startswith(f"1. Ed Wood (film)\nURL: {page}")
    assert "Tim Burton" in calls[1]["output"]


def test_eval_with_web_tools_against_the_local_web(hotpot_web, tmp_path, capsys):
    """`arpo eval --tools web_search,browse` runs end to end (the tiny random model writes no calls, so
    this checks the wiring: flags, tools, prompt template and scoring)."""
    assert main(["eval", "--model", "tiny-random", "--data", "hotpotqa:dev", "--limit", "2", "--tools",
                 "web_search,browse", "--web-url", hotpot_web, "--max-response-tokens", "16", "--json", "--quiet",
                 "--out", str(tmp_path / "e.json")]) == 0
    res = json.loads(capsys.readouterr().out)["results"]["hotpotqa:dev"]
    assert res["questions"] == 2 and res["tools"] == ["web_search", "browse"]
    rec = json.loads((tmp_path / "e.json").read_text())["records"]["hotpotqa:dev"]
    assert len(rec) == 2


def test_web_search_unreachable_local_web_is_an_error_result_not_a_crash():
    from arpo.tools import build_tools

    reg = build_tools(["web_search"], web={"url": f"http://127.0.0.1:{free_port()}", "retries": 0})
    r = reg["web_search"]("anything")
    assert not r.ok and r.output.startswith("Error: web search failed: cannot reach local")
    reg.close()


def test_arpo_tool_runs_one_web_call(hotpot_web, capsys):
    assert main(["tool", "web_search", "Ed Wood film", "--web-url", hotpot_web, "--web-top-k", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["output"].startswith(f"1. Ed Wood (film)\nURL: {hotpot_web}/wiki/Ed_Wood_(film)")
    assert main(["tool", "browse", f"{hotpot_web}/wiki/Ed_Wood_(film) | director", "--web-url", hotpot_web]) == 0
    assert "Tim Burton" in capsys.readouterr().out


def test_serve_agent_takes_web_settings_from_flags_over_the_run(tmp_path):
    """`arpo serve agent`: tools.web of the run's config.yaml, the --web-* flags on top."""
    import yaml

    from arpo.cli import build_parser
    from arpo.commands.serve import agent_config, run_settings

    (tmp_path / "config.yaml").write_text(yaml.safe_dump(
        {"tools": {"enabled": ["web_search", "browse"], "web": {"url": "http://127.0.0.1:1", "top_k": 2}}}))
    args = build_parser().parse_args(["serve", "agent", "--model", str(tmp_path), "--web-url", "http://127.0.0.1:2"])
    cfg = agent_config(args, run_settings(str(tmp_path)))
    assert cfg.tools.enabled == ["web_search", "browse"]
    assert cfg.tools.web == WebConfig(url="http://127.0.0.1:2", top_k=2)


def test_arpo_training_steps_with_web_tools_on_the_local_web(user_web, tmp_path, scripted_training):
    """`arpo train` with tools.enabled [web_search, browse] and tools.web (the example's shape): two ARPO
    steps of the tiny model whose text is scripted to search and browse the local web, scored by the
    format check that knows the web tags."""
    from arpo.testing import save_tiny_model

    save_tiny_model(tmp_path / "model")
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": f"Which star is the brightest? ({i})", "answers": ["Sirius"],
                                        "task": "qa"}) + "\n" for i in range(4)))
    script = ["<think> search </think><web_search> brightest star </web_search>",
              f"<browse> {user_web}/wiki/Sirius | brightest </browse>",
              "<answer> \\boxed{Sirius} </answer>"]
    ov = {"model.name": tmp_path / "model", "data.path": data, "tools.enabled": "[web_search,browse]",
          "tools.web": f"{{url: '{user_web}', top_k: 1, snippet_chars: 40, window_chars: 80}}",
          "agent.max_response_tokens": 700, "rollout.group_size": 2, "rollout.initial_rollouts": 2, "steps": 2,
          "prompts_per_step": 1, "optim.lr": 1e-3, "run.dir": tmp_path / "run", "run.save_every": 0,
          "run.tensorboard": "false", "run.threads": 1}
    scripted_training(ov, script)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # both calls ran against the local web and succeeded; the scripted answer is right
        calls = (r["tool_calls_per_traj/web_search"], r["tool_calls_per_traj/browse"], r["tool_failures"])
        assert calls == (1.0, 1.0, 0), r
        assert (r["format_error_rate"], r["reward_mean"], r["accuracy"]) == (0.0, 1.0, 1.0), r


def test_served_web_runs_the_command_and_says_why_it_did_not_start(tmp_path):
    """arpo.web.process.served_web: `arpo web serve` as a child process, up when the block starts and
    gone when it ends; a corpus it cannot serve is an ArpoError carrying the server's own message."""
    from arpo.errors import ArpoError
    from arpo.web.process import served_web

    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    with served_web(str(tmp_path / "c.jsonl")) as url:
        health = httpx.get(url + "/health", timeout=5).json()
        assert health["status"] == "ok" and health["pages"] == 3
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/health", timeout=2)
    with pytest.raises(ArpoError, match=r"arpo web serve --corpus .*nothing\.jsonl .*exited with \d+:\n.+"):
        with served_web(str(tmp_path / "nothing.jsonl")):
            pass


SERVE_AND_WAIT = """
import sys, time
from arpo.training.signals import TerminateAsInterrupt
from arpo.web.process import served_web
try:
    with TerminateAsInterrupt(), served_web(sys.argv[1]) as url:
        print(url, flush=True)
        time.sleep(120)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_sigterm_stops_the_served_web_with_its_parent(tmp_path):
    """A program stopped by SIGTERM outside a training step (`arpo` installs TerminateAsInterrupt for
    every command) still runs its cleanups: the web it served is stopped, not left holding its port.
    Without it, Python dies at once and the server lives on."""
    import signal

    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-c", SERVE_AND_WAIT, str(tmp_path / "c.jsonl")], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.communicate(timeout=60)[0].strip() == "interrupted"
    finally:
        proc.kill()
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/health", timeout=2)


def test_every_command_runs_with_sigterm_as_an_interrupt(monkeypatch):
    import signal

    from arpo.commands import web
    from arpo.training.signals import TerminateAsInterrupt

    seen = []
    monkeypatch.setattr(web, "run_serve", lambda args: seen.append(signal.getsignal(signal.SIGTERM)) or 0)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["web", "serve"]) == 0
    assert seen == [TerminateAsInterrupt._handle] and signal.getsignal(signal.SIGTERM) is before
