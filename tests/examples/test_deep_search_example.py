"""examples/deep_search: the RL task set run.sh makes (rl_tasks.py) is non-empty and disjoint from
the SFT data; run.sh itself runs end to end by hand (its README records a run)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "deep_search"))

from rl_tasks import pick  # noqa: E402

from arpo.errors import ArpoError  # noqa: E402


def test_pick_takes_the_last_questions_not_in_the_sft_data():
    rows = [{"id": f"q{i}"} for i in range(6)]
    assert [r["id"] for r in pick(rows, {"q5", "q1"}, 2)] == ["q3", "q4"]
    with pytest.raises(ArpoError, match="only 1 training questions are not in the SFT data; 2 wanted"):
        pick(rows[:2], {"q0"}, 2)


def test_the_script_on_the_built_in_hotpotqa_train_split(tmp_path):
    """As run.sh calls it: the SFT data holds rows made from the split's first questions (here the ids
    of its first 48 and of its very last row); 2 other training questions come out, loadable as data."""
    from arpo.data.datasets import load_examples

    train = load_examples("hotpotqa:train")
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({"id": r["id"]}) + "\n" for r in train[:48] + train[-1:]))
    out = tmp_path / "rl_tasks.jsonl"
    r = subprocess.run([sys.executable, str(ROOT / "examples/deep_search/rl_tasks.py"), str(sft), str(out),
                        "--data", "hotpotqa:train", "-n", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks"] == 2
    tasks = load_examples(out)
    assert [t["id"] for t in tasks] == [train[-3]["id"], train[-2]["id"]]
    assert all(t["question"] == q["question"] for t, q in zip(tasks, train[-3:-1], strict=True))
