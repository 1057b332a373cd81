"""Issue 42 item 8: what a newcomer's first tries found (silent-wrong answers, tracebacks, data lost,
hangs). Each test failed before its fix."""

from __future__ import annotations

import io
import time

from arpo.cli import main
from arpo.settings import SFTConfig


def test_chat_reads_the_question_from_stdin_with_a_dash(capsys, monkeypatch):
    """`echo q | arpo chat -` asked the model "-"."""
    import arpo.data.prompts as prompts

    asked = []
    render = prompts.render_prompt
    monkeypatch.setattr(prompts, "render_prompt", lambda tok, q, *a, **k: asked.append(q) or render(tok, q, *a, **k))
    monkeypatch.setattr("sys.stdin", io.StringIO("What is 2+3?\n"))
    rc = main(["chat", "--model", "tiny-random", "--tools", "none", "--max-response-tokens", "2", "--json", "-"])
    assert rc == 0 and asked == ["What is 2+3?"], (asked, capsys.readouterr().err[-500:])
    from arpo.commands.chat import read_question

    monkeypatch.setattr("sys.stdin", io.StringIO("What is 2+3?\n"))
    assert read_question("-") == "What is 2+3?"
    assert read_question("-x") == "-x"


def test_an_empty_question_is_refused_before_the_model_loads(capsys, monkeypatch):
    """An empty question generated for 95 s (the whole budget) before answering nothing."""
    t0 = time.perf_counter()
    assert main(["chat", "--model", "tiny-random", "  "]) == 2
    assert "the question is empty" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["chat", "--model", "tiny-random", "-"]) == 2
    assert "nothing on standard input" in capsys.readouterr().err
    assert time.perf_counter() - t0 < 30


def test_two_data_flags_evaluate_both():
    """`arpo eval --data A --data B` evaluated only B (the second flag replaced the first)."""
    from arpo.cli import build_parser

    args = build_parser().parse_args(["eval", "--model", "m", "--data", "a.jsonl", "--data", "b.jsonl", "c.jsonl"])
    assert args.data == ["a.jsonl", "b.jsonl", "c.jsonl"]


def test_two_rows_with_one_id_are_refused(tmp_path):
    """Results are keyed by id: two rows with one id counted as one question."""
    import json

    import pytest

    from arpo.data.datasets import load_examples
    from arpo.errors import ArpoError

    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"id": "q1", "question": "1+1?", "answer": "2", "task": "math"}) + "\n"
                 + json.dumps({"id": "q1", "question": "2+2?", "answer": "4", "task": "math"}) + "\n")
    with pytest.raises(ArpoError, match=r"d.jsonl:2: id 'q1' is already the id of .*d.jsonl:1"):
        load_examples(f)


def test_an_empty_answer_is_refused(tmp_path):
    """`answer: ""` was accepted: a question nothing could ever answer right."""
    import json

    import pytest

    from arpo.data.datasets import load_examples
    from arpo.errors import ArpoError

    for row in ({"question": "q?", "answer": ""}, {"question": "q?", "answers": ["", " "]},
                {"question": "q?", "answer": "steps #### "}):
        f = tmp_path / "d.jsonl"
        f.write_text(json.dumps(row) + "\n")
        with pytest.raises(ArpoError, match="empty"):
            load_examples(f)


def test_a_plug_in_tool_that_blocks_does_not_keep_the_process_alive(tmp_path):
    """A plug-in tool that blocks printed its timeout, then the process never exited: the call's
    worker thread was joined at exit (train, eval, chat and serve share the path)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "blocker.py"
    script.write_text(
        "import threading\n"
        "from arpo.tools.plugins.function import FunctionTool, ToolOptions\n"
        "def stuck(x: str) -> str:\n"
        "    '''Never returns.\n\n    Args:\n        x: anything\n    '''\n"
        "    threading.Event().wait()\n"
        "t = FunctionTool(stuck, options=ToolOptions(timeout_s=0.3))\n"
        "r = t.call({'x': 'a'})\n"
        "print(r.ok, r.output)\n"
        "t.close()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0 and "False Error: tool stuck timed out after 0.3 s" in out.stdout, out


def _tiny_disk(tmp_path):
    """A real 64 KB filesystem (tmpfs), filled up: a full disk. Needs root (CI runs as root)."""
    import os
    import subprocess

    import pytest

    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                                           capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    with open(disk / "filler", "wb") as f:
        try:
            f.write(b"\0" * (1 << 20))
        except OSError:
            pass
    return disk


def test_a_full_disk_is_one_line_and_eval_keeps_its_results(tmp_path, capsys):
    """A full disk gave tracebacks (train's checkpoint, eval --out, compare, ...), and eval --out threw
    the finished evaluation away."""
    import json
    import subprocess

    from arpo.commands.eval import write_out

    disk = _tiny_disk(tmp_path)
    try:
        ev = tmp_path / "a.json"
        ev.write_text(json.dumps({"results": {"d": {"pass@1": 0.5, "n": 2}}}))
        rc = main(["compare", f"a={ev}", "--out", str(disk / "c.json")])
        err = capsys.readouterr().err
        assert rc == 2 and "c.json: No space left on device" in err and "Traceback" not in err, err
        assert not list(disk.glob(".c.json.tmp-*"))  # no half-written file left behind
        kept = write_out(disk / "e.json", json.dumps({"results": {"x": 1}}))
        assert kept != disk / "e.json" and json.loads(kept.read_text()) == {"results": {"x": 1}}
        assert "the evaluation is kept in" in capsys.readouterr().err
        kept.unlink()
    finally:
        subprocess.run(["umount", str(disk)])


def test_a_full_disk_while_saving_weights_is_one_line(tmp_path, tiny_lm):
    """train's checkpoint and the first model conversion write safetensors: a full disk there was a
    traceback (or, worse, "corrupt weights file")."""
    import subprocess

    from arpo.errors import explain
    from arpo.jsonl import write_jsonl

    disk = _tiny_disk(tmp_path)
    try:
        try:
            tiny_lm.save_pretrained(disk / "m")
        except Exception as e:  # noqa: BLE001 - whatever the writer raises must be explained in one line
            msg = explain(e)
            assert msg is not None and "no space left" in msg, (type(e), e)
        else:
            raise AssertionError("the tiny model fitted on a full 64 KB disk")
        try:
            write_jsonl(disk / "rows.jsonl", [{"x": "y" * 100_000}])
        except OSError as e:
            assert explain(e) == f"{disk / 'rows.jsonl'}: No space left on device"
    finally:
        subprocess.run(["umount", str(disk)])


def test_no_tools_are_reported_as_none():
    """`arpo eval --tools none` printed "tools default"."""
    from arpo.commands.from_run import template_line

    assert "tools none," in template_line("eval", "m", None, "flags", "")
    assert "tools python," in template_line("eval", "m", None, "flags", "python")


def test_a_class_tool_whose_constructor_raises_is_one_line(tmp_path, monkeypatch, capsys):
    """A class tool whose constructor raises gave a traceback in `arpo tool`, train and chat."""
    import sys

    (tmp_path / "badtools.py").write_text(
        "class Shop:\n"
        "    '''A shop.'''\n"
        "    def __init__(self):\n"
        "        raise ConnectionError('database is down')\n"
        "    def __call__(self, order_id: str) -> str:\n"
        "        '''Look up.\n\n        Args:\n            order_id: the order\n        '''\n"
        "        return 'x'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "badtools", raising=False)
    rc = main(["tool", "badtools:Shop", '{"order_id": "1"}'])
    err = capsys.readouterr().err
    assert rc == 2 and "tool class badtools:Shop: its constructor raised ConnectionError: database is down" in err
    assert "Traceback" not in err


def test_a_tool_closed_while_its_sandbox_starts_prints_no_traceback(tmp_path):
    """A command that fails right after building the python tool (`arpo sft-data svamp --data
    hotpotqa:train`) printed the zygote's BrokenPipeError traceback at exit."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for pause in (0.3, 0.6, 1.0):  # closed while the zygote imports its preloads, before it says hello
        script = ("import time\nfrom arpo.tools.python import PythonTool\n"
                  f"t = PythonTool()\ntime.sleep({pause})\nt.close()\n")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr


def test_run_plots_have_whole_step_ticks_and_every_tool_in_the_legend():
    """`arpo plot` drew fractional step ticks (0.5, 1.5) and left plug-in tools' call curves out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from arpo.analysis.curves import draw_panel, panel_keys

    rows = [{"step": s, "reward_mean": 0.1 * s, "tool_calls_per_traj": 1.0, "tool_calls_per_traj/lookup": 1.0,
             "tool_calls_per_traj/python": 0.5} for s in (1, 2, 3)]
    keys = panel_keys(rows)
    assert keys["tool_calls"] == ["tool_calls_per_traj", "tool_calls_per_traj/python", "tool_calls_per_traj/lookup"]
    fig = draw_panel(rows, "tool_calls", keys["tool_calls"])
    ax = fig.axes[0]
    fig.canvas.draw()
    lo, hi = ax.get_xlim()
    ticks = [x for x in ax.get_xticks() if lo <= x <= hi]
    assert ticks and all(float(x).is_integer() for x in ticks), ticks
    assert [t.get_text() for t in ax.get_legend().get_texts()] == keys["tool_calls"]
    plt.close(fig)


def test_print_config_json_is_json(capsys):
    """`arpo train --print-config --json` printed YAML."""
    import json

    assert main(["train", "--print-config", "--json", "rollout.group_size=8"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["rollout"]["group_size"] == 8 and cfg["algo"]["preset"] == "arpo" and "memory_estimate" in cfg
    assert main(["sft", "--print-config", "--json"]) == 0
    assert "optim" in json.loads(capsys.readouterr().out)


def test_eval_of_hop2_asks_with_hop2s_tool_and_prompt(capsys):
    """`arpo eval --data hop2:dev` used the python tool and the math prompt instead of hop2's lookup
    tool and prompt (its rows' task is math); a flag still wins."""
    from arpo.data.sources import builtin_agent

    assert builtin_agent("hop2:dev[0:3]") == (("arpo.data.hop2:lookup",), "hop2")
    assert builtin_agent("webhop:test") == (("web_search", "browse"), "webhop")
    assert builtin_agent("svamp:test") == ((), None) and builtin_agent("my.jsonl") == ((), None)
    rc = main(["eval", "--model", "tiny-random", "--data", "hop2:dev[0:1]", "--max-response-tokens", "2"])
    err = capsys.readouterr().err
    assert rc == 0 and "prompt template hop2" in err and "tools lookup," in err, err[-800:]
    rc = main(["eval", "--model", "tiny-random", "--data", "hop2:dev[0:1]", "--max-response-tokens", "2",
               "--tools", "python"])
    err = capsys.readouterr().err
    assert rc == 0 and "tools python," in err, err[-800:]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hotpot_row(tmp_path, name="d.jsonl"):
    import json

    f = tmp_path / name
    f.write_text(json.dumps({"id": "a", "question": "Who?", "answer": "Bob",
                             "supporting_facts": {"title": ["Bob page"], "sent_id": [0]}}) + "\n")
    return f


def test_web_sft_data_never_empties_the_data_or_a_good_output(tmp_path, capsys):
    """`arpo web sft-data --out` equal to `--data` emptied the data file, and a rerun where nothing
    checked out (the web down) replaced a good output with an empty one."""
    data = _hotpot_row(tmp_path)
    before = data.read_text()
    down = f"http://127.0.0.1:{_free_port()}"
    assert main(["web", "sft-data", "--data", str(data), "--out", str(data), "--web-url", down, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert data.read_text() == before and f"--out {data} would overwrite the input {data}" in err, err
    good = tmp_path / "good.jsonl"
    good.write_text('{"question": "kept"}\n')
    assert main(["web", "sft-data", "--data", str(data), "--out", str(good), "--web-url", down, "--quiet"]) != 0
    assert good.read_text() == '{"question": "kept"}\n', capsys.readouterr().err


def test_a_judge_cache_that_is_not_one_is_refused(tmp_path):
    """`--judge-cache` pointed at the data file appended judgments to the dataset (any file was)."""
    import pytest

    from arpo.errors import ArpoError
    from arpo.eval.judge import JudgeCache

    data = _hotpot_row(tmp_path)
    with pytest.raises(ArpoError, match=r"d.jsonl:1: not a judge cache"):
        JudgeCache(data)
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(ArpoError, match="not a judge cache"):
        JudgeCache(tmp_path / "notes.txt")
    cache = JudgeCache(tmp_path / "c.jsonl")  # new, then reopened: a cache
    cache.put({"key": "k", "verdict": True})
    assert JudgeCache(tmp_path / "c.jsonl").get("k") == {"key": "k", "verdict": True}


def test_an_mcp_server_printing_to_stdout_fails_at_once_in_one_line(tmp_path, capfd):
    """An MCP server that printed to stdout dumped the SDK's traceback and failed 45 s later with
    "initialize timed out" (its text ran into the reply to initialize)."""
    import sys

    import pytest

    from arpo.errors import ArpoError
    from arpo.tools import build_tools

    pytest.importorskip("mcp")
    p = tmp_path / "noisy_server.py"
    p.write_text("import sys\nfrom mcp.server.mcpserver import MCPServer\n"
                 "app = MCPServer('noisy', log_level='CRITICAL')\n"
                 "sys.stdout.write('loading my database... '); sys.stdout.flush()\n"
                 "@app.tool()\ndef add(a: int, b: int) -> int:\n    '''Add.'''\n    return a + b\n"
                 "app.run()\n")
    t0 = time.perf_counter()
    with pytest.raises(ArpoError, match=r"noisy_server\.py: .*wrote a line that is not JSON-RPC to its stdout "
                                        r"\('loading my database"):
        build_tools([], mcp=[{"command": sys.executable, "args": [str(p)], "timeout_s": 5}],)
    assert time.perf_counter() - t0 < 40
    assert "Traceback" not in capfd.readouterr().err


def test_web_sft_data_with_the_local_web_down_fails_at_once_naming_it(tmp_path, capsys):
    """With the local web down, `arpo web sft-data` ran 456 s in silence, then wrote an empty file
    ("search failed: 300"); with a provider's key missing it failed the same way without naming it."""
    data = _hotpot_row(tmp_path)
    down = f"http://127.0.0.1:{_free_port()}"
    t0 = time.perf_counter()
    assert main(["web", "sft-data", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--web-url", down]) == 2
    err = capsys.readouterr().err
    assert f"the local web at {down} does not answer" in err and "arpo web serve --corpus" in err, err
    assert time.perf_counter() - t0 < 30 and not (tmp_path / "o.jsonl").exists()


def test_a_missing_provider_key_is_named_at_the_start_of_every_command(tmp_path, capsys, monkeypatch):
    """`arpo train` with serper and no key trained on (every search an error); eval, chat, serve agent
    and web sft-data the same: all check with one function (settings/web.py require_web_keys) at start."""
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    data = _hotpot_row(tmp_path)
    web = ["--tools", "web_search", "--web-provider", "serper"]
    commands = {
        "train": ["train", "model.name=tiny-random", f"data.path={data}", "tools.enabled=[web_search]",
                  "tools.web.provider=serper", f"run.dir={tmp_path / 'run'}", "steps=1", "--quiet"],
        "eval": ["eval", "--model", "tiny-random", "--data", str(data), *web, "--quiet"],
        "chat": ["chat", "--model", "tiny-random", *web, "Who?"],
        "serve agent": ["serve", "agent", "--model", "tiny-random", *web, "--port", str(_free_port())],
        "web sft-data": ["web", "sft-data", "--data", str(data), "--out", str(tmp_path / "o.jsonl"),
                         "--web-provider", "serper"],
    }
    import arpo.models

    def no_model(*a, **k):
        raise AssertionError("a model loaded before the key was checked")

    monkeypatch.setattr(arpo.models, "load_model", no_model)
    for name, argv in commands.items():
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and "needs an API key: set the environment variable SERPER_API_KEY" in err, (name, err[-800:])
    assert not (tmp_path / "run").exists()


def test_a_reward_returning_inf_or_nan_fails_its_start_check_by_name(tmp_path, monkeypatch):
    """A reward returning `inf` passed the start check and killed the step."""
    import pytest

    from arpo.errors import ArpoError
    from arpo.rewards import get_reward_fn
    from arpo.rewards.custom import check_reward
    from arpo.rewards.result import RewardResult

    (tmp_path / "bad_rewards.py").write_text(
        "from arpo.rewards.result import RewardResult\n"
        "def inf(response, example):\n    return float('inf')\n"
        "def minus_inf(response, example):\n    return {'reward': 0.5, 'score': float('-inf')}\n"
        "def nan(response, example):\n    return float('nan')\n"
        "def own(response, example):\n    return RewardResult(float('inf'), 1.0, True, None, None, True)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ex = [{"id": "a", "question": "1+1?", "answers": ["2"], "task": "math"}]
    for name in ("inf", "minus_inf", "nan", "own"):
        spec = f"bad_rewards:{name}"
        with pytest.raises(ArpoError, match=rf"reward '?bad_rewards:{name}\b.*(inf|nan)"):
            check_reward(get_reward_fn(spec), ex, name=spec)
    check_reward(lambda r, e, **k: RewardResult(1.0, 1.0, True, None, None, True), ex)  # finite: fine


def test_experiment_methods_are_checked_at_config_time(tmp_path, capsys):
    """`arpo experiment hop2-arpo-vs-grpo "methods=[]"` failed after the SFT with an IndexError."""
    import arpo.experiments.hop2 as hop2

    cases = {"methods=[]": "methods: needs at least one algo preset",
             "methods=[arpo,nope]": "methods: unknown algo preset 'nope'",
             "methods=[arpo,grpo,arpo]": "methods: arpo given twice"}
    for name in ("hop2-arpo-vs-grpo", "svamp-arpo-vs-grpo", "arpo-vs-grpo"):
        for over, msg in cases.items():
            t0 = time.perf_counter()
            rc = main(["experiment", name, over, "--out", str(tmp_path / "x")])
            err = capsys.readouterr().err
            assert rc == 2 and msg in err, (name, over, err[-500:])
            assert time.perf_counter() - t0 < 30 and not (tmp_path / "x").exists()  # before any SFT
    assert hop2.Hop2ExperimentConfig().methods == ["arpo", "grpo"]


def test_web_serve_keeps_pages_with_one_title_and_prints_the_port_it_got(tmp_path):
    """`arpo web serve` dropped the second of two pages with one title, and `--port 0` never printed
    the port it listened on. A real `arpo web serve` on 127.0.0.1."""
    import json
    import os
    import re
    import subprocess
    import sys

    import httpx

    rows = [{"title": "Springfield", "text": "Springfield, Illinois is the capital of Illinois."},
            {"title": "Springfield", "text": "Springfield, Massachusetts is where basketball began."}]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    f = tmp_path / "pages.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [sys.executable, "-m", "arpo", "web", "serve", "--corpus", str(f), "--port", "0"]
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and f"{f}:2: title (its id when a row has none) 'Springfield' is already the " \
        f"title of {f}:1, with another text; give each row its own 'id'" in refused.stderr, refused.stderr
    f.write_text("".join(json.dumps({"id": f"s{i}", **r}) + "\n" for i, r in enumerate(rows)))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r" on (http://127\.0\.0\.1:(\d+)) ", line)
        assert m and m.group(2) != "0", line
        url = m.group(1)
        hits = httpx.get(f"{url}/search", params={"q": "Springfield", "format": "json"}, timeout=30).json()["results"]
        assert sorted(h["url"] for h in hits) == [f"{url}/wiki/Springfield", f"{url}/wiki/Springfield_(2)"]
        assert "basketball" in httpx.get(f"{url}/wiki/Springfield_(2)", timeout=30).text
    finally:
        proc.terminate()
        proc.wait(10)


def test_chat_streams_the_answer_as_it_is_generated(monkeypatch):
    """`arpo chat` printed nothing until the whole answer was done. The tiny model's answer reaches
    stdout in several writes, made while it is being generated."""
    import arpo.rollout.agent as agent

    writes: list[tuple[str, bool]] = []
    generating = [False]

    class Out(io.StringIO):
        def write(self, s):
            writes.append((s, generating[0]))
            return super().write(s)

    run = agent.AgentLoop.run

    def spy(self, *a, **k):
        generating[0] = True
        try:
            return run(self, *a, **k)
        finally:
            generating[0] = False

    monkeypatch.setattr(agent.AgentLoop, "run", spy)
    monkeypatch.setattr("sys.stdout", Out())
    assert main(["chat", "--model", "tiny-random", "--tools", "none", "--max-response-tokens", "12",
                 "--temperature", "1", "--quiet", "hello"]) == 0
    during = [s for s, gen in writes if gen and s.strip()]
    assert len(during) >= 2, writes


def test_sft_says_what_it_does_before_its_first_step(tmp_path, capsys):
    """The deep-search SFT showed nothing for its first 260 s (model load, tokenization, first step)."""
    import json

    from arpo.config import load_config
    from arpo.recipes import sft

    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "response": "<answer> \\boxed{2} </answer>"}) + "\n")
    ov = [f"data.path=[{data}]", "model.name=tiny-random", "prompts_per_step=1", "steps=1", "run.tensorboard=false"]
    sft.run(load_config(SFTConfig, None, ov + [f"run.dir={tmp_path / 'a'}"]))
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("sft: ")]
    assert [x.split(" (")[0] for x in lines[:1]] == ["sft: loading the model tiny-random"], err
    assert any(x.startswith("sft: tokenizing 1 rows") for x in lines), err
    assert any(x.startswith("sft: step 1/1 running") for x in lines), err
    assert err.index("sft: step 1/1 running") < err.index("sft step 1/1"), err  # before the step's own line
    sft.run(load_config(SFTConfig, None, ov + [f"run.dir={tmp_path / 'b'}"]), quiet=True)
    assert "sft: " not in capsys.readouterr().err  # --quiet
