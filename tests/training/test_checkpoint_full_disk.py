"""A checkpoint that cannot be written (a full disk: here a file-size limit makes the weights' write
fail, EFBIG, as ENOSPC would) ends `arpo train` with one error line, exit 2, and no half-written
checkpoint folder left behind (it gave two tracebacks and left `.step_*.tmp-*`)."""

import json
import os
import resource
import signal
import subprocess
import sys


def _limited():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (48 * 1024, 48 * 1024))


def test_a_checkpoint_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    from arpo.testing import save_tiny_model

    save_tiny_model(tmp_path / "m")
    assert os.path.getsize(next((tmp_path / "m").glob("*.safetensors"))) > 48 * 1024  # the limit stops the weights
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "What is 2+2?", "answer": "4", "task": "math"}) + "\n")
    p = subprocess.run([sys.executable, "-m", "arpo", "train", f"model.name={tmp_path / 'm'}", f"data.path={data}",
                        "steps=1", "prompts_per_step=1", "rollout.group_size=2", "rollout.initial_rollouts=2",
                        "agent.max_response_tokens=6", f"run.dir={tmp_path / 'run'}", "run.tensorboard=false",
                        "run.save_rollouts=0", "--quiet"], capture_output=True, text=True, timeout=300,
                       preexec_fn=_limited, env=dict(os.environ, OMP_NUM_THREADS="1"))
    err = p.stderr
    assert p.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert "cannot write the checkpoint of step 1 in" in err and "resume with --resume" in err, err[-2000:]
    left = list((tmp_path / "run" / "checkpoints").iterdir())
    assert left == [], left
