"""What a run directory says about running its agent, shared by `arpo chat`, `arpo eval` and `arpo serve
agent`: with `--model RUN_DIR` (or one of its checkpoints) the run's tools, prompt template and call
format are the defaults of those flags, so a model trained on the `calc` prompt is asked with it.

Train runs keep them in RUN_DIR/config.yaml (tools.*, agent.*, data.template); SFT runs in
RUN_DIR/agent.yaml, written from the prompts of the SFT rows (recipes/sft.py `agent_yaml`)."""

from __future__ import annotations

from pathlib import Path

from arpo.errors import ArpoError

# flag -> (the run's config key, default)
RUN_KEYS = {
    "tools": ("tools.enabled", ["python"]), "session": ("tools.python_session", False),
    "search_index": ("tools.search_index", None), "search_url": ("tools.search_url", None),
    "search_top_k": ("tools.search_top_k", 3), "search_max_chars": ("tools.search_max_chars", 300),
    "tool_format": ("agent.tool_format", "tags"), "max_tool_calls": ("agent.max_tool_calls", 5),
    "max_response_tokens": ("agent.max_response_tokens", 1024), "template": ("data.template", None),
    "web": ("tools.web", {}),
}


def run_dir_of(model: str) -> Path | None:
    """The run directory of a model spec: RUN_DIR itself, or RUN_DIR/checkpoints/step_N[/model]."""
    p = Path(model).expanduser()
    if not p.is_dir():
        return None
    parts = p.resolve().parts
    d = Path(*parts[: len(parts) - 1 - parts[::-1].index("checkpoints")]) if "checkpoints" in parts else p
    return d if (d / "config.yaml").is_file() or (d / "agent.yaml").is_file() else None


def run_defaults(model: str) -> dict:
    """The run's settings keyed by flag (RUN_KEYS; keys it lacks are left out); {} for anything that is
    not a run dir or inside one."""
    import yaml

    d = run_dir_of(model)
    if d is None:
        return {}
    out = {}
    for name in ("config.yaml", "agent.yaml"):  # agent.yaml (SFT: the prompts it trained on) wins
        p = d / name
        if not p.is_file():
            continue
        try:
            cfg = yaml.safe_load(p.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ArpoError(f"{p}: cannot read the run's config: {e}") from e
        for flag, (key, _) in RUN_KEYS.items():
            section, field = key.split(".")
            sec = cfg.get(section) if isinstance(cfg, dict) else None
            if isinstance(sec, dict) and sec.get(field) is not None:
                out[flag] = sec[field]
    return out


def resolve(args, run: dict, flags=("tools", "template", "tool_format", "session")) -> str:
    """Fill the flags left unset (None) from the run (tools: only from the run; the caller knows its
    own default), then RUN_KEYS' defaults; a template follows the run's only when the tools do too.
    Returns where the template comes from, for the line that shows it."""
    given_tools = getattr(args, "tools", None) is not None
    explicit = getattr(args, "template", None) is not None
    for flag in flags:
        if getattr(args, flag, None) is not None:
            continue
        if flag == "template":
            setattr(args, flag, None if given_tools else run.get("template"))
        elif flag == "tools":
            v = run.get("tools")
            setattr(args, flag, ",".join(v) if isinstance(v, list) else v)
        else:
            setattr(args, flag, run.get(flag, RUN_KEYS[flag][1]))
    if explicit:
        return "--template"
    return "the run's" if getattr(args, "template", None) is not None else "chosen from the tools and the task"


def template_line(command: str, model: str, template: str | None, source: str, tools: str | None) -> str:
    """The line every agent command prints (stderr) about the prompt it uses."""
    return (f"arpo {command}: prompt template {template or 'default'} ({source}), tools "
            f"{tools or 'default'}, model {model}")
