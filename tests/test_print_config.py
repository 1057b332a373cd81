"""`--print-config` (issue 29): every line of the printed config has a meaning (a comment on it, or
a comment block right above it), the algorithm's keys show the preset's effective values (never
null), and the output is a valid config that loads back to the same run."""

import dataclasses

import pytest
import yaml

from arpo.cli import main
from arpo.config import from_dict


def _uncommented(text: str) -> list[str]:
    """The key lines with no comment on them and none right above them."""
    lines = text.splitlines()
    bad = []
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if "  # " in line:
            continue
        if i > 0 and lines[i - 1].lstrip().startswith("#"):
            continue
        bad.append(line)
    return bad


@pytest.mark.parametrize("command", ["train", "sft", "rollout"])
def test_every_printed_line_has_a_meaning(command, capsys):
    assert main([command, "--print-config"]) == 0
    out = capsys.readouterr().out
    assert _uncommented(out) == []
    assert len(out.splitlines()) > 20


@pytest.mark.parametrize("preset", ["arpo", "grpo", "dapo", "gspo", "aepo"])
def test_algo_shows_the_presets_values_and_loads_back(preset, capsys):
    from arpo.algos.presets import get_preset
    from arpo.settings import TrainConfig

    assert main(["train", "--print-config", f"algo.preset={preset}", "rollout.group_size=8"]) == 0
    out = capsys.readouterr().out
    data = yaml.safe_load(out)
    algo = data["algo"]
    assert None not in algo.values(), algo
    p = get_preset(preset)
    for k, v in algo.items():
        if k == "preset":
            continue
        want = getattr(p, k)
        assert v == (0 if k == "dual_clip" and want is None else want), (k, v, want)
    # the printed config is a config: it loads back and resolves to the same algorithm
    cfg = from_dict(TrainConfig, data)
    assert cfg.rollout.group_size == 8
    default = from_dict(TrainConfig, {"algo": {"preset": preset}, "rollout": {"group_size": 8}})
    got, want = cfg.algo.resolve(), default.algo.resolve()
    assert dataclasses.asdict(got) == dataclasses.asdict(want)


def test_train_honours_run_log_every(tmp_path, scripted_run):
    """run.log_every was printed (and documented) for train but only sft read it."""
    import json

    run = scripted_run(tmp_path, steps=3, **{"run.log_every": 2})
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 3]


def test_print_config_lists_the_branch_rules(capsys):
    """`arpo train --print-config` (and `--json`) lists every branch rule, one line each (issue 41);
    the text stays a config that loads."""
    import json

    from arpo.settings import BRANCH_RULES

    assert main(["train", "--print-config"]) == 0
    out = capsys.readouterr().out
    for name in {"auto"} | set(BRANCH_RULES):
        assert sum(line.startswith(f"#   {name}: ") for line in out.splitlines()) == 1, name
    assert yaml.safe_load(out)["rollout"]["branch_rule"] == "auto"
    assert main(["train", "--print-config", "--json"]) == 0
    rules = json.loads(capsys.readouterr().out)["branch_rules"]
    assert set(rules) == {"auto"} | set(BRANCH_RULES)
    assert "largest ΔH" in rules["top_entropy"]


def test_print_config_json_is_json(capsys):
    """`arpo train --print-config --json` printed YAML (issue 42 item 8)."""
    import json

    assert main(["train", "--print-config", "--json", "rollout.group_size=8"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["rollout"]["group_size"] == 8 and cfg["algo"]["preset"] == "arpo" and "memory_estimate" in cfg
    assert main(["sft", "--print-config", "--json"]) == 0
    assert "optim" in json.loads(capsys.readouterr().out)
