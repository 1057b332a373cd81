"""`arpo view`'s JSON endpoints (FastAPI TestClient), its errors, broken input, the static export,
and the speed of a large run (1,000 steps × 64 trees)."""

import gzip
import json
import os
import random
import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from arpo.errors import ArpoError
from arpo.training.rollout_log import tree_summary
from arpo.view.data import PAGE, Catalog
from arpo.view.server import create_app


def client(*specs):
    return TestClient(create_app(Catalog([str(s) for s in specs])), base_url="http://127.0.0.1")


def test_endpoints_of_a_run(tiny_run):
    c = client(tiny_run)
    runs = c.get("/api/runs").json()
    assert runs["page_size"] == PAGE
    [run] = runs["runs"]
    assert run["name"] == "run" and run["kind"] == "run" and run["saved_steps"] == 3
    assert run["config"]["preset"] == "arpo" and run["config"]["group_size"] == 4

    rows = c.get("/api/runs/0/metrics").json()["rows"]
    logged = [json.loads(x) for x in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["reward_mean"] == logged[0]["reward_mean"]
    assert rows[0]["branch_rate"] == logged[0]["branches"] / logged[0]["trajectories"]

    steps = c.get("/api/runs/0/steps").json()["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3] and all(s["bytes"] > 0 for s in steps)

    page = c.get("/api/runs/0/steps/2/page/0").json()
    assert (page["total"], page["pages"], page["skipped"]) == (2, 1, [])
    with gzip.open(tiny_run / "rollouts" / "step_2.jsonl.gz", "rt") as f:
        stored = [json.loads(x) for x in f]
    assert [t["rewards"] for t in page["trees"]] == [[round(t["reward"], 4) for t in s["trajectories"]] for s in stored]
    assert [t["index"] for t in page["trees"]] == [0, 1]

    tree = c.get("/api/runs/0/steps/2/trees/1").json()
    assert tree["trajectories"] == stored[1]["trajectories"] and tree["trees_in_step"] == 2
    assert tree["question"] == stored[1]["question"]

    ent = c.get("/api/runs/0/entropy").json()
    assert ent["scope"] == "run" and ent["steps"] == 3 and [p["step"] for p in ent["per_step"]] == [1, 2, 3]
    assert ent["tool_results"] == 2 * ent["trajectories"] and ent["after_tool"][0] is not None
    one = c.get("/api/runs/0/steps/3/entropy").json()
    assert one["scope"] == "step" and one["step"] == 3 and one["initial"][0] is not None

    for bad in ("/api/runs/1/metrics", "/api/runs/0/steps/9/page/0", "/api/runs/0/steps/2/page/1",
                "/api/runs/0/steps/2/trees/2", "/api/nothing"):
        r = c.get(bad)
        assert r.status_code == 404 and r.json()["detail"], bad
    assert "arpo view" in c.get("/").text
    assert "function lineChart" in c.get("/static/app.js").text


def test_several_runs_and_labels(tiny_run):
    runs = client(f"arpo={tiny_run}", f"grpo={tiny_run}").get("/api/runs").json()["runs"]
    assert [r["name"] for r in runs] == ["arpo", "grpo"]
    same = client(tiny_run, tiny_run).get("/api/runs").json()["runs"]
    assert [r["id"] for r in same] == [0, 1]


def test_missing_or_wrong_run_dir_is_one_clear_error(tmp_path, capsys):
    from arpo.cli import main

    with pytest.raises(ArpoError, match="does not exist"):
        Catalog([str(tmp_path / "nope")])
    assert main(["view", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nope does not exist" in err and "Traceback" not in err
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArpoError, match="no metrics.jsonl and no rollouts/"):
        Catalog([str(tmp_path / "empty")])
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(ArpoError, match="not a .jsonl"):
        Catalog([str(tmp_path / "x.txt")])


def test_half_written_files_report_skipped_lines(tiny_run, tmp_path):
    with gzip.open(tiny_run / "rollouts" / "step_1.jsonl.gz", "rt") as f:
        lines = f.read().splitlines()
    cut = tmp_path / "cut.jsonl"  # a crash while the second tree was written: no newline, half a line
    cut.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])
    page = client(cut).get("/api/runs/0/steps/0/page/0").json()
    assert page["total"] == 1
    assert len(page["skipped"]) == 1 and re.match(r"cut\.jsonl:2: .*line skipped", page["skipped"][0])

    bad = tmp_path / "bad.jsonl"  # garbage in the middle
    bad.write_text(lines[0] + "\n{not json\n" + lines[1] + "\n")
    c = client(bad)
    page = c.get("/api/runs/0/steps/0/page/0").json()
    assert page["total"] == 2 and page["skipped"] == ["bad.jsonl:2: Expecting property name enclosed in double quotes, "
                                                      "line skipped"]
    assert c.get("/api/runs/0/steps/0/trees/1").json()["prompt_id"] == json.loads(lines[1])["prompt_id"]

    gz = tmp_path / "step_7.jsonl.gz"  # a gzip stream cut short: the complete lines before the cut are kept
    data = gzip.compress(("\n".join(lines) + "\n").encode())
    gz.write_bytes(data[: int(len(data) * 0.8)])
    page = client(gz).get("/api/runs/0/steps/7/page/0").json()
    assert page["total"] == 1 and any("compressed stream cut" in s for s in page["skipped"])


def test_an_arpo_rollout_dump_is_shown_as_trees(tmp_path, tiny_run):
    from arpo.cli import main

    out = tmp_path / "rollouts.jsonl"
    assert main(["rollout", "--out", str(out), "--quiet", f"model.name={tiny_run.parent / 'model'}",
                 f"data.path={tiny_run.parent / 'q.jsonl'}", "data.limit=2", "tools.enabled=[]",
                 "agent.max_response_tokens=8", "rollout.group_size=3", "rollout.initial_rollouts=1",
                 "rollout.branch_threshold=0.0"]) == 0
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    c = client(out)
    page = c.get("/api/runs/0/steps/0/page/0").json()
    assert page["total"] == 2 and [t["trajectories"] for t in page["trees"]] == [3, 3]
    tree = c.get("/api/runs/0/steps/0/trees/0").json()
    mine = [r for r in recs if r["prompt_id"] == tree["prompt_id"]]
    for t, r in zip(tree["trajectories"], mine, strict=True):
        assert t["tokens"] == r["tokens"][t["start"]:] and t["reward"] == r["reward"] and t["advantage"] is None
    assert c.get("/api/runs/0/metrics").json()["rows"] == []
    assert c.get("/api/runs/0/entropy").json()["trajectories"] >= 2


def test_export_writes_the_same_answers(tiny_run, tmp_path):
    from arpo.cli import main
    from arpo.view.export import data_file

    site = tmp_path / "site"
    assert main(["view", str(tiny_run), "--export", str(site), "--steps", "1,3"]) == 0
    html = (site / "index.html").read_text()
    assert "window.ARPO_EXPORT = true" in html and 'src="app.js"' in html and "static/" not in html
    assert (site / "app.js").is_file() and (site / "style.css").is_file()
    cat = Catalog([str(tiny_run)])
    paths = ["runs", "runs/0/metrics", "runs/0/steps", "runs/0/entropy", "runs/0/steps/1/page/0",
             "runs/0/steps/1/trees/1", "runs/0/steps/3/entropy"]
    for p in paths:
        text = (site / "data" / data_file(p)).read_text()
        m = re.fullmatch(r'ARPO\.put\(("[^"]+"), (.*)\);\n', text, re.S)
        assert m and json.loads(m.group(1)) == p and json.loads(m.group(2)) == cat.get(p)
    assert not (site / "data" / data_file("runs/0/steps/2/page/0")).exists()  # --steps 1,3
    assert main(["view", str(tiny_run), "--export", str(site)]) == 0  # re-export over a site: fine
    assert (site / "data" / data_file("runs/0/steps/2/trees/0")).exists()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "precious.txt").write_text("x")
    with pytest.raises(ArpoError, match="not an exported site"):
        from arpo.view.export import export_site

        export_site(cat, tmp_path / "other")


def test_cli_serves_and_prints_its_url(tiny_run):
    import httpx

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-m", "arpo", "view", str(tiny_run), "--port", "0"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        assert httpx.get(url + "api/runs", timeout=30).json()["runs"][0]["saved_steps"] == 3
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_a_rebinding_page_cannot_read_the_runs(tiny_run):
    """A real server on 127.0.0.1: a request whose Host is another name (a page that rebound its DNS name to
    127.0.0.1) gets HTTP 400 and no run; loopback names get the runs (issue 61: before, 200 with metrics)."""
    import threading

    import httpx

    from arpo.view.server import serve

    got: list = []
    ready = threading.Event()
    th = threading.Thread(target=serve, args=(Catalog([str(tiny_run)]), "127.0.0.1", 0),
                          kwargs={"on_ready": lambda url: (got.append(url), ready.set())}, daemon=True)
    th.start()
    assert ready.wait(30)
    url = got[0]
    port = url.rsplit(":", 1)[1].strip("/")
    for _ in range(100):
        try:
            ok = httpx.get(url + "api/runs", timeout=5)
            break
        except httpx.ConnectError:
            time.sleep(0.1)
    assert ok.status_code == 200 and ok.json()["runs"]
    assert httpx.get(url + "api/runs", headers={"Host": f"localhost:{port}"}, timeout=5).status_code == 200
    bad = httpx.get(url + "api/runs", headers={"Host": f"attacker.example:{port}"}, timeout=5)
    assert bad.status_code == 400 and "runs" not in bad.text and "invalid Host header" in bad.text
    bad = httpx.get(url + "api/runs/0/metrics", headers={"Host": "attacker.example"}, timeout=5)
    assert bad.status_code == 400


# ---- a large run: 1,000 steps × 64 trees ----------------------------------------------------------
def _big_tree(rng, step, index, m=16, n_global=8, length=700):
    words = ["the", " of", " and", " to", " in", " is", " was", "<python>", " x", " =", " 17", "*", "23", "\n"]

    def traj(i, parent, b):
        start = b or 0
        k = length - start
        return {"id": i, "parent": parent, "branch_at": b, "reward": round(rng.random(), 3),
                "correct": rng.random() > .5, "answer": "42", "format_error": None, "finish_reason": "answer",
                "n_tokens": length, "initial_entropy": 1.2, "step_entropies": [1.4],
                "tool_calls": [{"tool": "python", "input": "x", "output": "1", "ok": True, "elapsed_s": 0.1,
                                "result_span": [300, 320]}],
                "decisions": [{"tool_call_index": 0, "probability": 0.6, "delta_entropy": 0.2,
                               "branched": parent is None}],
                "start": start, "tokens": [rng.choice(words) for _ in range(k)],
                "mask": [0 if 300 <= start + j < 320 else 1 for j in range(k)],
                "entropy": [round(rng.random() * 3, 3) for _ in range(k)],
                "logp": [round(-rng.random() * 3, 4) for _ in range(k)],
                "advantage": [round(rng.random() - .5, 4)] * length}
    trajs = [traj(i, None, None) for i in range(n_global)] + [traj(n_global + i, i, 320) for i in range(m - n_global)]
    rec = {"format": "arpo-rollouts/1", "step": step, "index": index, "prompt_id": f"q-{index}",
           "question": "What is 17*23?", "gold": ["391"], "task": "math", "prompt": "system prompt " * 80,
           "preset": "arpo", "attribution": "soft", "trained": True, "trajectories": trajs}
    return {"summary": tree_summary(rec), **rec}


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    """1,000 saved steps of 64 trees × 16 trajectories (≈ 540k tokens a step, the size of a real
    ARPO step): one step file, hard-linked as every step (the viewer reads each on its own)."""
    run = tmp_path_factory.mktemp("big")
    (run / "rollouts").mkdir()
    rng = random.Random(0)
    first = run / "rollouts" / "step_1.jsonl.gz"
    with gzip.open(first, "wt", compresslevel=1) as f:
        for i in range(64):
            f.write(json.dumps(_big_tree(rng, 1, i)) + "\n")
    for s in range(2, 1001):
        os.link(first, run / "rollouts" / f"step_{s}.jsonl.gz")
    keys = ["reward_mean", "accuracy", "initial_entropy", "post_tool_entropy", "branches", "trajectories", "loss",
            "clip_frac", "approx_kl", "response_length", "time_generation", "time_training", "step_seconds"]
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, **{k: rng.random() for k in keys}}) + "\n"
                                               for s in range(1, 1001)))
    prof = {"trajectories": 512, "tool_results": 512, "window": 50, "initial": [1.0] * 50, "after_tool": [1.5] * 50,
            "counts_initial": [512] * 50, "counts_after_tool": [512] * 50, "after_tool_by_call": {}}
    (run / "rollouts" / "entropy.jsonl").write_text(
        "".join(json.dumps({"step": s, **prof}) + "\n" for s in range(1, 1001)))
    return run


def test_a_large_run_opens_each_page_in_under_0_8s(big_run):
    c = client(big_run)
    took = {}

    def get(path):
        t = time.perf_counter()
        r = c.get("/api/" + path)
        took[path] = time.perf_counter() - t
        assert r.status_code == 200, r.text
        return r.json()

    assert len(get("runs")["runs"]) == 1
    assert len(get("runs/0/metrics")["rows"]) == 1000
    assert len(get("runs/0/steps")["steps"]) == 1000
    page = get("runs/0/steps/500/page/0")
    assert page["total"] == 64 and page["pages"] == 3 and len(page["trees"]) == PAGE
    assert get("runs/0/steps/500/page/2")["trees"][-1]["index"] == 63
    assert len(get("runs/0/steps/500/trees/63")["trajectories"]) == 16
    assert get("runs/0/steps/999/trees/5")["index"] == 5  # another step: read from disk again
    assert get("runs/0/entropy")["steps"] == 1000
    assert get("runs/0/steps/999/entropy")["step"] == 999
    print("\nlarge run, seconds per request: " + ", ".join(f"{p} {s:.3f}" for p, s in took.items()))
    assert max(took.values()) < 0.8, took  # README: under 0.4 s; 2x headroom for a busy CI machine
