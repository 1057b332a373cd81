"""`arpo sft` has a `memory` section (activation checkpointing, as `arpo train`): the same losses with
it on; and a run stopped early reports the steps it did ("steps 2" after step 1 of 2)."""

import json
import os
import signal
import subprocess
import sys

from arpo.cli import main
from arpo.testing import save_tiny_model


def _rows(tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1?", "response": f"<answer> \\boxed{{{i + 1}}} </answer>"})
                            + "\n" for i in range(4)))
    return data


def test_activation_checkpointing_in_sft_gives_the_same_losses(tmp_path, capsys):
    save_tiny_model(tmp_path / "m")
    data = _rows(tmp_path)
    losses = []
    for ac in ("false", "true"):
        run = tmp_path / f"run_{ac}"
        assert main(["sft", f"model.name={tmp_path / 'm'}", f"data.path=[{data}]", "prompts_per_step=2", "steps=2",
                     f"memory.activation_checkpointing={ac}", f"run.dir={run}", "run.tensorboard=false",
                     "--quiet", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["steps"] == 2
        losses.append([json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines()])
        assert "activation_checkpointing: " + ac in (run / "config.yaml").read_text()
    assert losses[0] == losses[1] or all(abs(a - b) < 1e-5 for a, b in zip(*losses, strict=True)), losses


def test_a_stopped_sft_reports_the_steps_it_did(tmp_path):
    save_tiny_model(tmp_path / "m")
    data = _rows(tmp_path)
    p = subprocess.Popen([sys.executable, "-m", "arpo", "sft", f"model.name={tmp_path / 'm'}", f"data.path=[{data}]",
                          "prompts_per_step=1", "steps=400", f"run.dir={tmp_path / 'run'}", "run.tensorboard=false",
                          "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    for line in p.stderr:
        if line.startswith("sft step 1/400"):
            p.send_signal(signal.SIGINT)
            break
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 130
    res = json.loads(out)
    done = len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines())  # log_every 1: one line a step
    assert res["steps"] == done < 400 and res["of_steps"] == 400, (res, done)
