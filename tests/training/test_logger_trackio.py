"""run.trackio (issue 63, item 6): metrics mirrored to a real trackio store (TRACKIO_DIR in a temporary
folder, a process of its own: trackio reads TRACKIO_DIR when imported); a resumed run continues it."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("trackio")

SCRIPT = """
import json, sys
from arpo.training.logger import MetricsLogger
run_dir, resume = sys.argv[1], sys.argv[2] == "resume"
cfg = {"run": {"trackio": "arpo-test"}, "lr": 1e-5}
log = MetricsLogger(run_dir, resume_step=1 if resume else None, tensorboard=False, config=cfg)
for step in ([2] if resume else [1]):
    log.log(step, {"reward_mean": 0.25 * step, "note": "text", "flag": True, "nan": float("nan")})
log.close()
from trackio.sqlite_storage import SQLiteStorage
logs = SQLiteStorage.get_logs("arpo-test", "myrun")
keep = ("step", "reward_mean", "note", "flag", "nan")
print("RESULT", json.dumps([{k: v for k, v in r.items() if k in keep} for r in logs]))
"""


def test_metrics_reach_a_real_trackio_store_and_a_resume_continues_the_run(tmp_path):
    env = dict(os.environ, TRACKIO_DIR=str(tmp_path / "trackio"), HF_HUB_OFFLINE="1")
    run = tmp_path / "myrun"

    def go(mode):
        out = subprocess.run([sys.executable, "-c", SCRIPT, str(run), mode], env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]  # trackio prints too
        return json.loads(line[7:])

    assert go("new") == [{"step": 1, "reward_mean": 0.25}]  # numbers only (no text, bool or NaN)
    assert go("resume") == [{"step": 1, "reward_mean": 0.25}, {"step": 2, "reward_mean": 0.5}]


def test_trackio_missing_is_a_clear_error(tmp_path, monkeypatch):
    from arpo.errors import ArpoError
    from arpo.training.logger import MetricsLogger

    monkeypatch.setitem(sys.modules, "trackio", None)
    with pytest.raises(ArpoError, match="run.trackio is set but trackio is not installed"):
        MetricsLogger(tmp_path, tensorboard=False, config={"run": {"trackio": "p"}})
