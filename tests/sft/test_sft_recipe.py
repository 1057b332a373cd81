"""The SFT recipe's progress lines (recipes/sft.py) (issue 42 item 8: what a newcomer's first tries found;
each test failed before its fix)."""

from __future__ import annotations

from arpo.settings import SFTConfig


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
