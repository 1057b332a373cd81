"""`arpo eval --out X.json --resume` continues an interrupted evaluation from X.partial.jsonl (issue 62: an
interrupted `arpo eval` started again from the first question), and refuses other settings by name.

The evaluations are real `arpo eval` subprocesses over the tiny random-weight model. A reward plug-in
logs every question it scores (the questions the run generated) and, told to, stops at its (N+1)th
answer until the test's Ctrl-C arrives: the interruption falls at a known place."""

import json
import os
import signal
import subprocess
import sys
import time

from arpo.cli import main

REWARD = '''import os, time


def reward(response, example, finish_reason=None):
    if finish_reason is None:  # arpo's check call, before the model loads
        return 0.0
    log = os.environ["ARPO_TEST_REWARD_LOG"]
    with open(log, "a") as f:
        f.write(example["id"] + "\\n")
    pause = int(os.environ.get("ARPO_TEST_PAUSE_AFTER", "0"))
    if pause and sum(1 for _ in open(log)) > pause:
        time.sleep(300)  # the test presses Ctrl-C here
    return 0.0
'''
QUESTIONS = 8
BATCH = 2


def _setup(tmp_path):
    (tmp_path / "counting_reward.py").write_text(REWARD)
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i}+{i}?", "answer": str(2 * i),
                                     "task": "math"}) + "\n" for i in range(QUESTIONS)))
    return q


def _argv(q, out):
    return ["eval", "--model", "tiny-random", "--data", str(q), "--tools", "", "--batch-size", str(BATCH),
            "--max-response-tokens", "8", "--device", "cpu", "--reward", "counting_reward:reward", "--out", str(out)]


def _env(tmp_path, log, pause=0):
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path, ARPO_TEST_REWARD_LOG=str(log),
                ARPO_TEST_PAUSE_AFTER=str(pause))


def _eval(argv, env):
    p = subprocess.run([sys.executable, "-m", "arpo", *argv], capture_output=True, text=True, env=env, timeout=600)
    return p.returncode, p.stderr


def _scored(log):
    return log.read_text().split() if log.exists() else []


def test_an_interrupted_eval_resumes_where_it_stopped_and_equals_an_uninterrupted_one(tmp_path, capsys, monkeypatch):
    q = _setup(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # the reward plug-in, for the runs in this process
    ids = [f"q{i}" for i in range(QUESTIONS)]

    # the reference: one uninterrupted run
    ref, ref_log = tmp_path / "ref.json", tmp_path / "ref.log"
    rc, err = _eval(_argv(q, ref), _env(tmp_path, ref_log))
    assert rc == 0, err[-2000:]
    assert _scored(ref_log) == ids
    assert not (tmp_path / "ref.partial.jsonl").exists()  # gone once the final file is written

    # the same evaluation, Ctrl-C at its 5th answer: batches 1 and 2 (4 answers) are finished
    out, log = tmp_path / "ev.json", tmp_path / "ev.log"
    p = subprocess.Popen([sys.executable, "-m", "arpo", *_argv(q, out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env(tmp_path, log, pause=4))
    deadline = time.time() + 300
    while len(_scored(log)) < 5:
        assert p.poll() is None and time.time() < deadline, p.communicate()[1][-2000:]
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-2000:]
    assert "4 finished answers kept in" in err and "--resume" in err and "Traceback" not in err, err[-2000:]
    partial = tmp_path / "ev.partial.jsonl"
    assert partial.is_file()

    # a plain rerun does not throw the answers away, nor do other settings use them
    assert main(_argv(q, out)) == 2
    assert "holds 4 finished answers of an interrupted evaluation: add --resume" in capsys.readouterr().err
    assert main([*_argv(q, out), "--resume", "--max-response-tokens", "9"]) == 2
    err = capsys.readouterr().err
    assert "other settings (agent.max_response_tokens: 8 then, 9 now)" in err and err.count("\n") == 1, err

    # --resume: only the questions not finished are generated, and the file is the uninterrupted run's
    log.unlink()
    rc, err = _eval([*_argv(q, out), "--resume"], _env(tmp_path, log))
    assert rc == 0, err[-2000:]
    assert f"resuming {partial}: 4 of {QUESTIONS} answers finished" in err, err[-2000:]
    assert _scored(log) == ids[4:]
    assert not partial.exists()
    got, want = json.loads(out.read_text()), json.loads(ref.read_text())
    assert got["records"] == want["records"] and got["results"] == want["results"]
    assert "interrupted" not in got


def test_resume_needs_out_and_an_empty_resume_starts_from_the_first_question(tmp_path, capsys):
    q = _setup(tmp_path)
    assert main(["eval", "--model", "tiny-random", "--data", str(q), "--resume"]) == 2
    assert "--resume needs --out" in capsys.readouterr().err


def test_a_full_disk_under_out_is_one_line_before_the_model_loads(tmp_path, full_disk, capsys):
    """The partial file is written first: a disk with no room for it is said at once, in one line."""
    q = _setup(tmp_path)
    out = full_disk / "e.json"
    assert main(["eval", "--model", "tiny-random", "--data", str(q), "--tools", "", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "e.partial.jsonl: cannot write the evaluation's partial file (No space left on device)" in err, err
    assert err.count("\n") == 1 and not list(full_disk.glob(".e.partial.jsonl.tmp-*"))
