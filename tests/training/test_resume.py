"""`arpo sft` and `arpo train` on a tiny model: they run, log, checkpoint atomically, and a run
killed with SIGKILL then resumed gives the same metrics and weights as an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from arpo.settings import SFTConfig, TrainConfig

TIMING = ("seconds", "tokens_per_s", "time_", "tool_seconds")


def _clean(rows):
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in rows]


def _rows(run_dir):
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _weights(run_dir):
    ck = Path(run_dir) / "checkpoints"
    latest = (ck / "latest").read_text().strip()
    return load_file(str(ck / latest / "model" / "model.safetensors"))


def _train_args(tiny_dir, run_dir, steps=4):
    return ["train", f"model.name={tiny_dir / 'model'}", f"data.path={tiny_dir / 'q.jsonl'}", "tools.enabled=[]",
            "agent.max_response_tokens=12", "rollout.group_size=4", "rollout.initial_rollouts=2",
            "rollout.branch_threshold=0.0", "reward.fn=arpo.testing:toy_reward", f"steps={steps}",
            "prompts_per_step=2", "optim.lr=1e-2", f"run.dir={run_dir}", "run.save_every=1", "run.tensorboard=false",
            "run.threads=1", "--quiet"]


def _cli(args, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    return subprocess.Popen([sys.executable, "-m", "arpo", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_train_sigkill_resume_is_exact(tiny_dir, tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    a = _cli(_train_args(tiny_dir, full))
    b = _cli(_train_args(tiny_dir, cut))
    # kill b as soon as its second checkpoint is complete (it is then inside step 3)
    deadline = time.time() + 240
    while time.time() < deadline and b.poll() is None:
        if (cut / "checkpoints" / "step_000002" / "state.json").exists():
            b.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    b.wait()
    assert b.returncode == -signal.SIGKILL, b.stderr.read()[-2000:]
    assert not (cut / "checkpoints" / "step_000004").exists()
    out_a = a.communicate(timeout=300)
    assert a.returncode == 0, out_a[1][-3000:]
    r = _cli(_train_args(tiny_dir, cut) + ["--resume"])
    out_r = r.communicate(timeout=300)
    assert r.returncode == 0, out_r[1][-3000:]
    ra, rb = _clean(_rows(full)), _clean(_rows(cut))
    assert [x["step"] for x in rb] == [1, 2, 3, 4]
    assert ra == rb
    wa, wb = _weights(full), _weights(cut)
    assert wa.keys() == wb.keys()
    assert all((wa[k] == wb[k]).all() for k in wa)
    # the run learned something: weights moved from the initial model
    w0 = load_file(str(tiny_dir / "model" / "model.safetensors"))
    assert any(not (w0[k] == wa[k]).all() for k in wa)
    assert any(abs(x.get("pg_loss", 0)) > 0 for x in ra)
    # checkpoints: only the newest `keep_checkpoints` (2) survive, no temporary dirs left behind
    names = sorted(p.name for p in (full / "checkpoints").iterdir())
    assert names == ["latest", "step_000003", "step_000004"]


def test_sft_runs_masks_results_and_resumes(tiny_dir, tmp_path):
    from arpo.config import load_config
    from arpo.recipes import sft

    rows = []
    for i in range(4):
        resp = (f"<think> {i}*2 </think>\n<python>print({i}*2)</python>\n<result>\n{2 * i}\n</result>\n"
                f"<answer> \\boxed{{{2 * i}}} </answer>")
        s, e = resp.index("\n<result>"), resp.index("</result>\n") + len("</result>\n")
        rows.append({"question": f"{i}*2?", "response": resp, "system": "math", "tool_results": [[s, e]]})
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from arpo.sft.rows import tokenize_row
    from arpo.testing import tiny_tokenizer

    p, ids, mask = tokenize_row(tiny_tokenizer(), rows[0])
    text_masked = tiny_tokenizer().decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
    assert text_masked.strip().startswith("<result>") and text_masked.strip().endswith("</result>")
    assert ids[-1] == tiny_tokenizer().eos_token_id and mask[-1] == 1
    ov = [f"model.name={tiny_dir / 'model'}", f"data.path=[{data}]", "prompts_per_step=2", "epochs=2", "optim.lr=1e-3",
          f"run.dir={tmp_path / 'a'}", "run.save_every=1", "run.tensorboard=false"]
    full = sft.run(load_config(SFTConfig, None, ov), quiet=True)
    assert full["steps"] == 4
    losses = [r["loss"] for r in _rows(tmp_path / "a")]
    assert losses[-1] < losses[0]
    # a second run loses its last checkpoint (as if killed during step 4), then resumes from step 3
    import shutil

    ov_b = [x if not x.startswith("run.dir") else f"run.dir={tmp_path / 'b'}" for x in ov]
    sft.run(load_config(SFTConfig, None, ov_b), quiet=True)
    ck = tmp_path / "b" / "checkpoints"
    shutil.rmtree(ck / "step_000004")
    (ck / "latest").write_text("step_000003\n")
    sft.run(load_config(SFTConfig, None, ov_b), resume=True, quiet=True)
    assert _clean(_rows(tmp_path / "a")) == _clean(_rows(tmp_path / "b"))
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert all((wa[k] == wb[k]).all() for k in wa)
    # a fresh run into a dir with checkpoints is refused (stale checkpoints would mix in) ...
    from arpo.errors import ArpoError

    with pytest.raises(ArpoError, match="already holds checkpoints.*--resume.*--overwrite"):
        sft.run(load_config(SFTConfig, None, ov_b), quiet=True)
    # ... unless --overwrite: the old checkpoints and metrics are gone, the new run is the same run again
    ov_c = [x if not x.startswith("epochs") else "epochs=1" for x in ov_b]
    sft.run(load_config(SFTConfig, None, ov_c), quiet=True, overwrite=True)
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step_000001", "step_000002"]
    assert _clean(_rows(tmp_path / "b")) == _clean(_rows(tmp_path / "a"))[:2]


def test_bad_config_key_is_named(tiny_dir):
    from arpo.cli import main

    assert main(["train", "rollout.group_sise=4"]) == 2


def test_overrides_may_follow_options(capsys):
    """`arpo train --config X --quiet key=value`: the override after the options still reaches the
    config (here: its typo is named), while an unknown option is still argparse's usage error."""
    from arpo.cli import main

    assert main(["train", "--quiet", "rollout.group_sise=4"]) == 2
    assert "rollout.group_sise" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["train", "--quiet", "--bogus"])
    assert e.value.code == 2


def test_rollout_dump_carries_rewards(tiny_dir, tmp_path):
    from arpo.cli import main

    out = tmp_path / "r.jsonl"
    assert main(["rollout", "--out", str(out), "--quiet", f"model.name={tiny_dir / 'model'}",
                 f"data.path={tiny_dir / 'q.jsonl'}", "data.limit=2", "tools.enabled=[]",
                 "agent.max_response_tokens=8", "rollout.group_size=2", "rollout.initial_rollouts=2"]) == 0
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs) == 4
    # the tiny random model never writes the protocol: the real reward gives the format penalty
    assert all(r["reward"] == -1.0 and r["format_error"] for r in recs)
    assert all("".join(r["tokens"]) == r["text"] and len(r["tokens"]) == len(r["response_token_ids"]) for r in recs)


def test_train_validation_and_lora_smoke(tiny_dir, tmp_path):
    from arpo.config import load_config
    from arpo.recipes import train

    ov = [f"model.name={tiny_dir / 'model'}", f"data.path={tiny_dir / 'q.jsonl'}", "tools.enabled=[]",
          "agent.max_response_tokens=8", "rollout.group_size=2", "rollout.initial_rollouts=2",
          "reward.fn=arpo.testing:toy_reward", "steps=2", "prompts_per_step=1", "optim.lr=1e-2",
          f"run.dir={tmp_path / 'v'}", "run.tensorboard=false", f"validation.path={tiny_dir / 'q.jsonl'}",
          "validation.limit=2", "validation.every=1", "lora.enabled=true", "lora.r=4", "algo.preset=grpo"]
    out = train.run(load_config(TrainConfig, None, ov), quiet=True)
    rows = _rows(tmp_path / "v")
    assert [r["step"] for r in rows] == [1, 2]
    assert all("val/pass@1" in r and "val/score" in r for r in rows)
    ck = Path(out["checkpoint"]) / "model"
    assert (ck / "adapter_model.safetensors").is_file()  # LoRA: only the adapter is saved
    from arpo.models import load_model

    model, _ = load_model(str(tmp_path / "v"))  # a run dir loads its latest checkpoint, adapter merged
    assert not hasattr(model, "peft_config")
