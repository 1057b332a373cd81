"""Prompt rendering: system-prompt templates (data, in templates/prompts.yaml) + the tokenizer's own
chat template. The prompt is tokenized once; everything after it is built in token space."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from arpo.errors import ArpoError

DEFAULT_TEMPLATES = Path(__file__).with_name("templates") / "prompts.yaml"
TASK_TOOLS = {"math": ("python",), "calc": ("python",), "search": ("search",), "both": ("python", "search")}


@functools.lru_cache(maxsize=8)
def load_templates(path: str | None = None) -> dict:
    p = Path(path) if path else DEFAULT_TEMPLATES
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ArpoError(f"{p}: cannot read prompt templates: {e}") from e
    for key in ("templates", "tool_descriptions"):
        if not isinstance(data, dict) or not isinstance(data.get(key), dict):
            raise ArpoError(f"{p}: expected a mapping under '{key}'")
    return data


def default_template(tools: list[str]) -> str:
    """The task family that matches the enabled tools."""
    s = set(tools)
    if s == {"python"}:
        return "math"
    if s == {"search"}:
        return "search"
    return "both"


def system_prompt(template: str, tools: list[str], path: str | None = None) -> str:
    data = load_templates(path)
    if template not in data["templates"]:
        raise ArpoError(f"unknown prompt template {template!r}; choose one of {sorted(data['templates'])}")
    desc = "\n".join(data["tool_descriptions"].get(t, f"<{t}> input </{t}>") for t in tools)
    return data["templates"][template].replace("{tools}", desc)


def render_prompt(tokenizer, question: str, system: str) -> list[int]:
    """Token ids of system + user turn + the assistant header, via the tokenizer's chat template."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def prompts_for(examples, tokenizer, tools: list[str], template: str | None) -> list[list[int]]:
    """Rendered prompts. Without an explicit template, a math example gets the `math` prompt
    (python) and a QA example the `search` prompt when those tools are enabled — the prompts the
    cold-start SFT data (arpo sft-data) uses — else the template that matches the tools."""
    out = []
    for ex in examples:
        tmpl, names = template, tools
        if tmpl is None:
            tmpl = {"math": "math", "qa": "search"}.get(ex.get("task"), "")
            if tmpl and set(TASK_TOOLS[tmpl]) <= set(tools) and len(tools) > 1:
                names = list(TASK_TOOLS[tmpl])
            else:
                tmpl = default_template(tools)
        out.append(render_prompt(tokenizer, ex["question"], system_prompt(tmpl, names)))
    return out
