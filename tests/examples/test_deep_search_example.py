"""examples/deep_search: run.sh (webhop) uses the task's result sizes and template everywhere (SFT data,
RL, eval), trains RL on questions the SFT data did not use and evaluates on the held-out splits only;
the HotpotQA path (run_hotpotqa.sh): the RL task set rl_tasks.py makes is non-empty and disjoint from
the SFT data. The scripts themselves run end to end by hand (the README says what was measured)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "deep_search"))

from rl_tasks import pick  # noqa: E402

from arpo.errors import ArpoError  # noqa: E402

EX = ROOT / "examples" / "deep_search"


def _flag(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_run_sh_uses_the_tasks_sizes_template_and_disjoint_splits():
    import re

    import yaml

    from arpo.data import webhop
    from arpo.data.sources import split_slice

    sh = (EX / "run.sh").read_text()
    web = re.search(r"^WEB=\((.*)\)$", sh, re.M).group(1).split()
    assert {"top_k": int(_flag(web, "--web-top-k")), "snippet_chars": int(_flag(web, "--web-snippet-chars")),
            "window_chars": int(_flag(web, "--browse-window-chars"))} == webhop.WEB
    train = yaml.safe_load((EX / "train.yaml").read_text())
    assert {k: train["tools"]["web"][k] for k in webhop.WEB} == webhop.WEB
    assert train["data"]["template"] == "webhop" and set(train["tools"]["enabled"]) == set(webhop.TOOLS)
    ev = re.search(r"^EVAL=\((.*?)\)$", sh, re.M | re.S).group(1).split()
    agent = train["agent"]
    assert _flag(ev, "--template") == "webhop" and _flag(ev, "--max-response-tokens") == \
        str(agent["max_response_tokens"]) and _flag(ev, "--max-tool-calls") == str(agent["max_tool_calls"])
    assert [w for w in ev[ev.index("--data") + 1:] if w.startswith("webhop:")] == ["webhop:dev", "webhop:test"]
    sft_spec = re.search(r"web sft-data --data '([^']+)'", sh).group(1)
    _, a0, a1 = split_slice(sft_spec)
    _, b0, b1 = split_slice(train["data"]["path"])
    assert sft_spec.startswith("webhop:train") and train["data"]["path"].startswith("webhop:train")
    assert a1 is not None and b1 is not None and (a1 <= b0 or b1 <= a0)  # RL questions are not SFT questions
    assert (EX / "run_hotpotqa.sh").is_file() and "sft_hotpotqa.yaml" in (EX / "run_hotpotqa.sh").read_text()


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
