"""Issue 29: every mistake a newcomer makes gets one clear line and a non-zero exit, nothing they own
is lost, and nothing goes silently wrong. Each test failed before its fix."""

import json
import os
import subprocess
import sys
import time

import pytest

from arpo.cli import main
from arpo.settings import SFTConfig, TrainConfig

ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _arpo(*args, timeout=120, **kw):
    return subprocess.run([sys.executable, "-m", "arpo", *map(str, args)], capture_output=True, text=True, env=ENV,
                          timeout=timeout, **kw)


# ---- A. no output overwrites an input -------------------------------------------------------------------------
def test_no_output_overwrites_an_input(tmp_path, capsys):
    worked = tmp_path / "w.jsonl"
    text = json.dumps({"question": "2+2?", "calls": [{"tool": "python", "arguments": {"code": "print(4)"}}],
                       "answer": "4"}) + "\n"
    worked.write_text(text)
    rc = main(["sft-data", "tools", "--data", str(worked), "--tools", "python", "--out", str(worked), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "would overwrite the input" in err and worked.read_text() == text
    # a spelling that reaches the same file, and a slice of it
    rc = main(["sft-data", "svamp", "--data", f"{tmp_path}/./w.jsonl[0:1]", "--out", str(worked), "--quiet"])
    assert rc == 2 and "would overwrite the input" in capsys.readouterr().err and worked.read_text() == text
    # an index directory (replaced as a whole) that holds its own corpus
    corpus = tmp_path / "idx" / "corpus.jsonl"
    corpus.parent.mkdir()
    corpus.write_text(json.dumps({"id": "1", "title": "t", "text": "some text"}) + "\n")
    rc = main(["index", "build", str(corpus), "--out", str(corpus.parent), "--quiet"])
    assert rc == 2 and "would overwrite the input" in capsys.readouterr().err and corpus.is_file()
    ev = tmp_path / "e1.json"
    ev.write_text(json.dumps({"results": {}}))
    rc = main(["compare", f"a={ev}", "--out", str(ev)])
    assert rc == 2 and "would overwrite the input" in capsys.readouterr().err


# ---- B. a prompt longer than the model's context: one line, at once --------------------------------------------
def test_a_prompt_past_the_context_is_refused_before_any_compute(tmp_path, capsys):
    long_q = "How many apples? " * 3000  # well past tiny-random's 2048 positions
    t0 = time.perf_counter()
    rc = main(["chat", "--model", "tiny-random", "--tools", "python", long_q])
    err = capsys.readouterr().err
    assert rc == 2 and "this model's context holds 2048" in err and "tokens" in err, err[-2000:]
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "2+2?", "answer": "4", "task": "math"}) + "\n"
                    + json.dumps({"id": "long-one", "question": long_q, "answer": "4", "task": "math"}) + "\n")
    rc = main(["eval", "--model", "tiny-random", "--data", str(data), "--quiet", "--max-response-tokens", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and "the prompt of long-one has" in err and "context holds 2048" in err, err[-2000:]
    assert time.perf_counter() - t0 < 60


# ---- C. one clear line and a non-zero exit, never a traceback -------------------------------------------------
def test_output_piped_to_head_stops_quietly():
    p = subprocess.Popen([sys.executable, "-m", "arpo", "data", "show", "gsm8k:train", "--limit", "5000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    first = p.stdout.readline()
    p.stdout.close()  # what `| head -1` does
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert json.loads(first)["id"].startswith("gsm8k:train") and "Traceback" not in err and p.returncode == 141, err


def test_an_unwritable_output_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    ev = tmp_path / "e.json"
    ev.write_text(json.dumps({"results": {}}))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "1", "title": "t", "text": "some text"}) + "\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
    for argv in (["sft-data", "svamp", "--data", "svamp:train[0:2]", "--out", f"{blocker}/sub/x.jsonl", "--quiet"],
                 ["compare", str(ev), "--out", f"{blocker}/sub/c.json"],
                 ["view", str(run), "--export", f"{blocker}/site"],
                 ["index", "build", str(corpus), "--out", f"{blocker}/idx", "--quiet"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "cannot write there" in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_corrupt_weights_and_a_missing_vllm_are_one_line(tmp_path, capsys):
    from arpo.engine.vllm import vllm_available
    from arpo.testing import save_tiny_model

    d = tmp_path / "m"
    save_tiny_model(d)
    (d / "model.safetensors").write_bytes(os.urandom(4096))
    assert main(["chat", "--model", str(d), "hi"]) == 2
    assert "cannot load the model in" in capsys.readouterr().err
    if vllm_available():
        return
    t0 = time.perf_counter()
    assert main(["eval", "--engine", "vllm", "--data", "svamp:test", "--limit", "1"]) == 2
    assert "vLLM is not installed" in capsys.readouterr().err and time.perf_counter() - t0 < 10  # before any load
    assert main(["serve", "agent", "--engine", "vllm", "--model", "tiny-random", "--port", "18999"]) == 2
    assert "vLLM is not installed" in capsys.readouterr().err


def test_experiment_counts_must_be_positive(capsys):
    for argv in (["experiment", "arpo-vs-grpo", "--seeds", "0"], ["experiment", "svamp-arpo-vs-grpo", "--steps", "-1"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and "must be >= 1" in capsys.readouterr().err
    assert main(["experiment", "arpo-vs-grpo", "seeds=0"]) == 2
    assert "seeds: must be >= 1, got 0" in capsys.readouterr().err


REWARDS = '''
def raises(response, example):
    raise ValueError("my reward has a bug")

def plain_float(response, example):
    return 1.0 if "4" in response else 0.0

def as_dict(response, example, tools=None):
    return {"reward": 0.5, "correct": True, "tools_seen": list(tools or [])}

def trl_style(prompts, completions, answer, **kwargs):
    return [float(answer[0] in c) for c in completions]

def returns_text(response, example):
    return "good"
'''


@pytest.fixture()
def my_rewards(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "What is 2+2?", "answer": "4", "task": "math"}) + "\n")
    return data


def test_a_reward_that_raises_fails_before_the_model_loads(my_rewards, tmp_path, capsys):
    from arpo.config import load_config
    from arpo.errors import ArpoError
    from arpo.recipes import train

    t0 = time.perf_counter()
    for fn, msg in (("raises", "raised ValueError: my reward has a bug"), ("returns_text", "returned str 'good'")):
        assert main(["eval", "--model", "no_such_model_dir", "--data", str(my_rewards),
                     "--reward", f"my_rewards:{fn}"]) == 2  # the reward is checked before the model is even looked at
        assert msg in capsys.readouterr().err
        cfg = load_config(TrainConfig, None, [f"data.path={my_rewards}", "model.name=no_such_model_dir",
                                                    f"reward.fn=my_rewards:{fn}", f"run.dir={tmp_path / 'r'}"])
        with pytest.raises(ArpoError, match=msg):
            train.run(cfg, quiet=True)
    assert time.perf_counter() - t0 < 20 and not (tmp_path / "r").exists()


def test_rewards_may_return_a_float_a_dict_or_a_trl_list(my_rewards):
    from arpo.rewards import get_reward_fn

    ex = {"id": "q-1", "question": "What is 2+2?", "answers": ["4"], "answer": "4", "task": "math"}
    good = "<answer>\\boxed{4}</answer>"
    r = get_reward_fn("my_rewards:plain_float")(good, ex, tool_calls=[], tools=("python",), math_scorer="math_equal")
    assert (r.reward, r.score, r.correct, r.answer) == (1.0, 1.0, True, "4")
    r = get_reward_fn("my_rewards:as_dict")(good, ex, tool_calls=[], tools=("python",))
    assert (r.reward, r.score, r.correct) == (0.5, 0.5, True)
    r = get_reward_fn("my_rewards:trl_style")("no", ex, tools=("python",))
    assert (r.reward, r.correct) == (0.0, False)


def test_eval_runs_with_a_float_reward(my_rewards, tmp_path, capsys):
    out = tmp_path / "e.json"
    assert main(["eval", "--model", "tiny-random", "--data", str(my_rewards), "--reward", "my_rewards:plain_float",
                 "--max-response-tokens", "4", "--quiet", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())["records"][str(my_rewards)][0]
    assert rec["reward"] in (0.0, 1.0)


# ---- D. nothing silently wrong ---------------------------------------------------------------------------------
def test_own_data_says_what_task_it_inferred_and_task_sets_it(tmp_path, capsys):
    from arpo.data.datasets import load_examples

    data = tmp_path / "own.jsonl"
    data.write_text(json.dumps({"question": "What is 2+2?", "answer": "4"}) + "\n")
    assert load_examples(str(data))[0]["task"] == "qa"
    err = capsys.readouterr().err
    assert "1 of 1 rows have no 'task' field: 1 taken as qa (token-F1 scoring)" in err and "--task" in err
    assert load_examples(str(data), task="math")[0]["task"] == "math" and capsys.readouterr().err == ""
    load_examples("svamp:test[0:2]")
    assert capsys.readouterr().err == ""  # built-in data: nothing to say
    out = tmp_path / "e.json"
    assert main(["eval", "--model", "tiny-random", "--data", str(data), "--task", "math", "--max-response-tokens",
                 "4", "--quiet", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["results"][str(data)]["tools"] == ["python"]


def test_own_tools_are_described_on_builtin_data_and_templates_fit_the_tools(tmp_path, monkeypatch, capsys):
    from arpo.data.prompts import prompts_for
    from arpo.testing import tiny_tokenizer
    from arpo.tools import build_tools

    (tmp_path / "shop_tools.py").write_text('def lookup_order(order_id: str) -> str:\n'
                                            '    """Look up an order.\n\n    Args:\n'
                                            '        order_id: the order\n    """\n'
                                            '    return "shipped"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    tok = tiny_tokenizer()
    tools = build_tools(["python", "shop_tools:lookup_order"])
    try:
        ex = {"id": "q", "question": "2+2?", "answers": ["4"], "task": "math"}
        text = tok.decode(prompts_for([ex], tok, tools, None)[0])
        assert "<python>" in text and "<lookup_order> order_id </lookup_order>: Look up an order." in text
        with pytest.raises(Exception, match="describes no tools, so lookup_order would be callable"):
            prompts_for([ex], tok, tools, "calc")
    finally:
        tools.close()
    assert main(["chat", "--model", "tiny-random", "--tools", "search", "--template", "calc", "hi"]) == 2
    assert "prompt template 'calc' is written for the python tool, which is not enabled" in capsys.readouterr().err


def test_a_trained_run_remembers_its_prompt_template_and_tools(tmp_path, capsys):
    from arpo.commands.from_run import run_settings
    from arpo.config import load_config
    from arpo.recipes import sft

    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "system": "calc",
                                "response": "<think>add</think>\n<answer> \\boxed{2} </answer>"}) + "\n")
    run = tmp_path / "sft_run"
    sft.run(load_config(SFTConfig, None, ["model.name=tiny-random", f"data.path=[{data}]", "prompts_per_step=1",
                                              "steps=1", f"run.dir={run}", "run.tensorboard=false"]), quiet=True)
    ckpt = run / "checkpoints" / "step_000001" / "model"
    assert run_settings(str(run)) == run_settings(str(ckpt)) == {"template": "calc",
                                                                 "tools": {"enabled": ["python"]}}
    assert main(["chat", "--model", str(run), "--max-response-tokens", "2", "--temperature", "0", "2+2?"]) == 0
    assert "prompt template calc (the run's), tools python" in capsys.readouterr().err
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question": "2+2?", "answer": "4", "task": "math"}) + "\n")
    assert main(["eval", "--model", str(ckpt), "--data", str(q), "--max-response-tokens", "2"]) == 0
    assert "prompt template calc (the run's), tools python" in capsys.readouterr().err
    # rejection sampling from the run samples with its prompt too, and its rows say so
    out = tmp_path / "rs.jsonl"
    assert main(["sft-data", "rejection", "--model", str(run), "--data", str(q), "--samples", "1",
                 "--max-response-tokens", "2", "--out", str(out), "--quiet"]) == 2  # 2 tokens: no reward > 0
    err = capsys.readouterr().err
    assert "prompt template calc (the run's), tools python" in err and "no trajectory with reward > 0" in err
    # a flag wins: other tools, so the run's template does not follow
    assert main(["chat", "--model", str(run), "--tools", "python,search", "--max-response-tokens", "2", "hi"]) == 0
    assert "prompt template both (chosen from the tools and the task)" in capsys.readouterr().err


def test_an_empty_tool_list_means_no_tools_everywhere(tmp_path, capsys):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question": "2+2?", "answer": "4", "task": "math"}) + "\n")
    out = tmp_path / "e.json"
    assert main(["eval", "--model", "tiny-random", "--tools", "", "--data", str(q), "--max-response-tokens", "2",
                 "--quiet", "--out", str(out)]) == 0  # it used to fall back to python
    assert json.loads(out.read_text())["results"][str(q)]["tools"] == []
    from arpo.cli import build_parser
    from arpo.commands.serve import agent_config

    args = build_parser().parse_args(["serve", "agent", "--model", "m", "--tools", ""])
    assert agent_config(args, {"tools": {"enabled": ["search"]}}).tools.enabled == []
    with pytest.raises(SystemExit):
        main(["chat", "--tools", "none,python", "hi"])
    assert "does not combine" in capsys.readouterr().err


def test_meaningless_values_are_refused(tmp_path, monkeypatch, capsys):
    from arpo.errors import ArpoError
    from arpo.tools import build_tools

    (tmp_path / "shop2.py").write_text("def lookup_order(order_id: str) -> str:\n    return 'x'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ArpoError, match=r"tools.options.lookup_order.timeout_s: must be a number > 0, got -5"):
        build_tools(["shop2:lookup_order"], options={"lookup_order": {"timeout_s": -5}})
    with pytest.raises(ArpoError, match=r"tools.options: 'lookup_ordr' is none of your enabled tools \(lookup_order\)"):
        build_tools(["shop2:lookup_order"], options={"lookup_ordr": {"timeout_s": 5}})
    for argv in (["plot", "run", "--window", "0"], ["analyze", "entropy", "d.jsonl", "--window", "0"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "must be >= 1, got 0" in capsys.readouterr().err
    e1, e3 = tmp_path / "e1.json", tmp_path / "e3.json"
    for p in (e1, e3):
        p.write_text(json.dumps({"results": {}}))
    assert main(["compare", f"a={e1}", f"a={e3}"]) == 2
    assert "two eval files are labelled 'a'" in capsys.readouterr().err
    out = tmp_path / "sft.jsonl"
    assert main(["sft-data", "gsm8k", "--data", "svamp:train[0:3]", "--out", str(out), "--quiet"]) == 2
    assert "no SFT row checked out, nothing written" in capsys.readouterr().err and not out.exists()


# ---- E. friction ----------------------------------------------------------------------------------------------
def test_eval_without_a_terminal_prints_plain_progress_and_ctrl_c_keeps_the_answers(tmp_path):
    import signal

    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"question": f"What is {i}+{i}?", "answer": str(2 * i), "task": "math"}) + "\n"
                         for i in range(400)))
    out = tmp_path / "e.json"
    p = subprocess.Popen([sys.executable, "-m", "arpo", "eval", "--model", "tiny-random", "--data", str(q),
                          "--tools", "", "--batch-size", "1", "--max-response-tokens", "8", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    lines = []
    for line in p.stderr:  # stderr is a pipe: plain lines, while it runs
        lines.append(line)
        if ": 40/400 (10 %" in line:
            break
    p.send_signal(signal.SIGINT)
    rest_out, rest_err = p.communicate(timeout=120)
    assert p.returncode == 130, "".join(lines) + rest_err
    assert any(": 40/400 (10 %, elapsed" in x for x in lines), lines
    assert "finished answers kept in" in rest_err and "Traceback" not in rest_err
    saved = json.loads(out.read_text())
    assert saved["interrupted"] and len(saved["records"][str(q)]) >= 40
    assert saved["results"][str(q)]["questions"] >= 40


def test_a_child_of_the_suite_starts_with_ctrl_c_at_its_default():
    """The Ctrl-C tests above and in tests/tools/test_python_sessions.py failed when pytest was started
    in the background (SIGINT ignored, inherited by every child): tests/conftest.py restores it."""
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == "True"


def test_print_config_shows_the_presets_values(capsys):
    assert main(["train", "--print-config", "algo.preset=grpo", "algo.clip_high=0.28"]) == 0
    out = capsys.readouterr().out
    algo = out.split("\nalgo:")[1].split("\nreward:")[0]
    assert "the grpo preset's values" in algo and "null" not in algo and "clip_high: 0.28" in algo
    assert "clip_low: 0.2" in algo and "ppo_epochs: 1" in algo


def test_the_examples_in_sft_help_parse_and_chat_tool_are_quiet(capsys):
    import shlex

    from arpo.cli import build_parser
    from arpo.commands.sft import EXAMPLES

    parser = build_parser()
    for line in EXAMPLES.splitlines():
        if line.strip().startswith("arpo "):
            argv = shlex.split(line.split("  #")[0].strip())[1:]
            args, extra = parser.parse_known_args(argv)  # sft-data without --data used to exit 2 here
            assert not [a for a in extra if not ("=" in a and not a.startswith("-"))], line
    capsys.readouterr()
    assert main(["chat", "--model", "tiny-random", "--quiet", "--max-response-tokens", "2", "hi"]) == 0
    assert main(["tool", "python", "--quiet", "print(6*7)"]) == 0
    cap = capsys.readouterr()
    assert cap.err == "" and "42" in cap.out


def test_style_applies_to_gsm8k_only(tmp_path, capsys):
    assert main(["sft-data", "svamp", "--style", "stepwise", "--data", "svamp:train[0:2]", "--out",
                 str(tmp_path / "s.jsonl"), "--quiet"]) == 2
    assert "--style applies to gsm8k" in capsys.readouterr().err
