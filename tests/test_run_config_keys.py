"""A run's config.yaml with a key that is no setting (a typo) is an error naming the file and the key
for `arpo chat` / `arpo eval --model RUN_DIR`, as for `arpo train` (they dropped it silently)."""

import pytest
import yaml

from arpo.cli import build_parser
from arpo.commands.agent_flags import resolve
from arpo.errors import ArpoError


@pytest.mark.parametrize("section,key", [("agent", "max_tool_call"), ("tools", "python_timeout")])
@pytest.mark.parametrize("command", ["chat", "eval"])
def test_unknown_keys_of_a_run_are_errors(tmp_path, section, key, command):
    run = tmp_path / "run"
    run.mkdir()
    cfg = {"tools": {"enabled": ["python"]}, "agent": {"max_tool_calls": 2}}
    cfg[section][key] = 3
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    argv = (["chat", "--model", str(run), "hi"] if command == "chat" else
            ["eval", "--model", str(run), "--data", "svamp:test"])
    with pytest.raises(ArpoError, match=rf"{run}/config.yaml: unknown config key {section}.{key}; valid keys: "):
        resolve(build_parser().parse_args(argv), command)


def test_known_keys_of_a_run_are_taken(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"tools": {"enabled": ["python"]}, "agent": {"max_tool_calls": 2}}))
    r = resolve(build_parser().parse_args(["chat", "--model", str(run), "hi"]), "chat")
    assert r.agent.max_tool_calls == 2 and r.tools.enabled == ["python"]
