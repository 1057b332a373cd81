"""tools.web, tools.options and engine_options are typed sections of the one config tree (issue 64 item 3):
parsed once, at load, with errors that name the key; printed whole by `--print-config`; the tools get
the parsed object. Every committed config (configs/, examples/, the runs recorded in docs/results/)
still loads, and an old run's config still resumes and names no risky setting."""

import dataclasses
import subprocess
from pathlib import Path

import pytest
import yaml

from arpo.cli import main
from arpo.config import from_dict, load_config
from arpo.errors import ArpoError
from arpo.settings import (
    AgentConfig,
    EngineOptions,
    RolloutJobConfig,
    SFTConfig,
    ToolOptions,
    ToolsConfig,
    TrainConfig,
    WebConfig,
)

ROOT = Path(__file__).resolve().parents[1]


def test_print_config_shows_every_web_field_and_engine_option_with_its_default(capsys):
    """It printed `web: {}` and `engine_options: {}`: nothing said which keys there are."""
    assert main(["train", "--print-config"]) == 0
    out = capsys.readouterr().out
    data = yaml.safe_load(out)
    assert data["tools"]["web"] == dataclasses.asdict(WebConfig())
    assert data["engine_options"] == dataclasses.asdict(EngineOptions())
    assert "    timeout_s: 10.0  # per HTTP request" in out.splitlines()
    assert from_dict(TrainConfig, data).tools.web == WebConfig()  # and it loads back


def test_print_config_shows_your_tools_options():
    from arpo.config import explain

    cfg = load_config(TrainConfig, None, ["tools.enabled=[python, shop:lookup]",
                                          "tools.options={lookup: {timeout_s: 3}}"])
    assert cfg.tools.options == {"lookup": ToolOptions(timeout_s=3.0)}
    printed = yaml.safe_load(explain(cfg))["tools"]["options"]
    assert printed == {"lookup": dataclasses.asdict(ToolOptions(timeout_s=3.0))}


@pytest.mark.parametrize(("override", "message"), [
    ("tools.web.timeout_s=abc", r"tools.web.timeout_s: expected a number, got 'abc'"),
    ("tools.web.allow_private=maybe", r"tools.web.allow_private: expected true/false, got 'maybe'"),
    ("tools.web.top_k=0", r"tools.web.top_k: must be >= 1, got 0"),
    ("tools.web.provider=bing", r"tools.web.provider: 'bing'; choose one of"),
    ("tools.web.tmeout_s=3", r"unknown config key 'tools.web.tmeout_s'"),
    ("tools.options={lookup: {timeout_s: slow}}", r"tools.options.lookup.timeout_s: expected a number, got 'slow'"),
    ("tools.options={lookup: {timeout: 3}}", r"unknown config key 'tools.options.lookup.timeout'"),
    ("tools.options={lookup: {max_concurrency: 0}}", r"tools.options.lookup.max_concurrency: must be a number > 0"),
    ("tools.options={lookup: 3}", r"tools.options.lookup: expected a mapping of ToolOptions fields, got 3"),
])
def test_a_bad_value_names_its_key_when_the_config_loads(override, message):
    """A wrong type under tools.web reached WebConfig unchecked (`'abc' > 0`: a TypeError traceback)."""
    with pytest.raises(ArpoError, match=message):
        load_config(TrainConfig, None, ["tools.enabled=[python, shop:lookup]", override])


def test_the_tools_get_the_one_parsed_web_config():
    """WebConfig was re-parsed from the dict by the key check, the local-web check and each web tool."""
    from arpo.tools import tools_from_config

    cfg = load_config(TrainConfig, None, ["tools.enabled=[web_search, browse]", "tools.web.provider=ddgs",
                                          "tools.web.top_k=2"])
    reg = tools_from_config(cfg.tools)
    try:
        assert reg["web_search"].cfg is cfg.tools.web and reg["browse"].cfg is cfg.tools.web
    finally:
        reg.close()


def _committed_configs() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "configs", "examples", "docs/results"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.split() if p.endswith((".yaml", ".yml"))]


def _cls(path: str):
    name = Path(path).name
    if name.startswith("rollout"):
        return RolloutJobConfig
    return SFTConfig if name.startswith("sft") or "/sft/" in path else TrainConfig


def test_every_committed_config_loads():
    """The configs a user copies and the configs the recorded runs were made with (docs/results: saved
    when tools.web and engine_options were free dicts) load, validate and load back from their dump."""
    paths = _committed_configs()
    assert len(paths) > 100
    for path in paths:
        if Path(path).name == "agent.yaml":  # an SFT run's prompts: its tools and agent sections
            data = yaml.safe_load((ROOT / path).read_text())
            for key, cls in (("tools", ToolsConfig), ("agent", AgentConfig)):
                if key in data:
                    from_dict(cls, data[key], prefix=f"{key}.", where=f"{path}: ")
            continue
        cfg = load_config(_cls(path), str(ROOT / path))
        if hasattr(cfg, "validate"):
            cfg.validate()
        assert from_dict(type(cfg), dataclasses.asdict(cfg)) == cfg, path


def test_an_old_runs_config_resumes_and_names_nothing_risky(tmp_path):
    """A run saved with `web: {}` (or a few web keys: the recorded runs' sections) resumes: the missing
    keys were the defaults. A new run's whole tools.web (its defaults included) names no setting that
    sends anything anywhere but what the run set."""
    from arpo.commands.from_run import code_settings
    from arpo.training.rundir import RunDir

    for old in ("docs/results/branch_rules_hop2/rl/aepo_seed0/config.yaml",
                "docs/results/branch_rules_webhop/rl/aepo_seed0/config.yaml"):
        run = tmp_path / Path(old).parent.parent.parent.name
        run.mkdir()
        raw = yaml.safe_load((ROOT / old).read_text())
        cfg = load_config(TrainConfig, str(ROOT / old), [f"run.dir={run}"])
        saved = dataclasses.asdict(cfg)  # as this arpo saves it, but the two sections as they were saved
        saved["tools"]["web"], saved["engine_options"] = raw["tools"]["web"], raw["engine_options"]
        (run / "config.yaml").write_text(yaml.safe_dump(saved))
        RunDir(run, resume=True).check_resume_config(dataclasses.asdict(cfg))  # raised: tools.web.* changed
        assert code_settings(dataclasses.asdict(cfg.tools)) == code_settings(raw["tools"])  # the whole section
    assert code_settings({"web": dataclasses.asdict(WebConfig(url="http://10.0.0.1:1"))}) == [
        ("tools.web.url", "web_search (local) sends its queries and its key to http://10.0.0.1:1")]
