"""What a run directory says about running its agent, shared by `arpo chat`, `arpo eval` and `arpo serve
agent`: with `--model RUN_DIR` (or one of its checkpoints) the run's tools section (MCP servers, plug-in
tools and their options, web settings included), prompt template, call format and budgets are the
defaults of those commands (commands/agent_flags.py), so a model trained on the `calc` prompt is asked
with it.

Train runs keep them in RUN_DIR/config.yaml (tools.*, agent.*, data.template); SFT runs in
RUN_DIR/agent.yaml, written from the prompts of the SFT rows (recipes/sft.py `agent_yaml`)."""

from __future__ import annotations

from pathlib import Path

from arpo.errors import ArpoError


def run_dir_of(model: str) -> Path | None:
    """The run directory of a model spec: RUN_DIR itself, or RUN_DIR/checkpoints/step_N[/model]."""
    p = Path(model).expanduser()
    if not p.is_dir():
        return None
    parts = p.resolve().parts
    d = Path(*parts[: len(parts) - 1 - parts[::-1].index("checkpoints")]) if "checkpoints" in parts else p
    return d if (d / "config.yaml").is_file() or (d / "agent.yaml").is_file() else None


def run_settings(model: str) -> dict:
    """What the run says about its agent: {"tools": its tools section, "agent": its agent section,
    "template": data.template}, keys it lacks left out; {} for anything that is not a run dir or inside
    one. agent.yaml (SFT: the prompts it trained on) wins over config.yaml, section by section."""
    import yaml

    d = run_dir_of(model)
    if d is None:
        return {}
    out: dict = {}
    for name in ("config.yaml", "agent.yaml"):
        p = d / name
        if not p.is_file():
            continue
        try:
            cfg = yaml.safe_load(p.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ArpoError(f"{p}: cannot read the run's config: {e}") from e
        if not isinstance(cfg, dict):
            raise ArpoError(f"{p}: the run's config is not a mapping of sections")
        for section in ("tools", "agent"):
            sec = cfg.get(section)
            if isinstance(sec, dict):
                out[section] = {**out.get(section, {}), **{k: v for k, v in sec.items() if v is not None}}
        data = cfg.get("data")
        if isinstance(data, dict) and data.get("template") is not None:
            out["template"] = data["template"]
    return out


def template_line(command: str, model: str, template: str | None, source: str, tools: str | None) -> str:
    """The line every agent command prints (stderr) about the prompt it uses; no tools print as none
    (`--tools none` was reported as "tools default")."""
    return (f"arpo {command}: prompt template {template or 'default'} ({source}), tools "
            f"{tools or 'none'}, model {model}")
