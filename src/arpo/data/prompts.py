"""Prompt rendering: system-prompt templates (data, in templates/prompts.yaml) + the tokenizer's own
chat template. The prompt is tokenized once; everything after it is built in token space."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from arpo.errors import ArpoError

DEFAULT_TEMPLATES = Path(__file__).with_name("templates") / "prompts.yaml"
TASK_TOOLS = {"math": ("python",), "calc": ("python",), "search": ("search",), "both": ("python", "search")}
BUILTIN_TOOLS = ("python", "search")  # the tools the task templates are written for; any other tool is the user's


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


def default_template(tools) -> str:
    """The task family that matches the enabled tools."""
    s = set(_names(tools))
    if s == {"python"}:
        return "math"
    if s == {"search"}:
        return "search"
    return "both"


def _names(tools) -> list[str]:
    return list(tools.names) if hasattr(tools, "names") else list(tools)


def describe_tool(name: str, tool=None, data: dict | None = None) -> str:
    """One line of the system prompt for a tool in the tag format: the YAML description of a built-in
    tool, or one made from a tool's schema (a single string argument: the text between the tags;
    otherwise: a JSON object of arguments)."""
    data = data or load_templates(None)
    if name in data["tool_descriptions"]:
        return data["tool_descriptions"][name]
    if tool is None:
        return f"<{name}> input </{name}>"
    from arpo.tools.formats import tool_schema

    fn = tool_schema(tool)["function"]
    desc = " ".join((fn.get("description") or "").strip().split("\n\n")[0].split())
    props = fn.get("parameters", {}).get("properties", {})
    single = getattr(tool, "single_string_arg", None)
    if single or (len(props) == 1 and next(iter(props.values())).get("type") == "string"):
        return f"<{name}> {single or next(iter(props))} </{name}>: {desc}"
    args = ", ".join(f'"{k}": {v.get("type", "value")}' for k, v in props.items())
    return f"<{name}> {{{args}}} </{name}>: {desc} (the input is a JSON object of these arguments)"


def system_prompt(template: str, tools, path: str | None = None, tool_format: str = "tags") -> str:
    """The system prompt: a template with `{tools}` replaced by the tools' descriptions (tags), or,
    for the json format, by nothing (the chat template or the hermes block describes the tools)."""
    data = load_templates(path)
    if tool_format == "json":
        template = "json" if template in (None, "math", "search", "both", "calc") else template
    if template not in data["templates"]:
        raise ArpoError(f"unknown prompt template {template!r}; choose one of {sorted(data['templates'])}")
    if tool_format != "json":  # json: the chat template or the hermes block describes the tools
        check_template(template, _names(tools), data["templates"][template])
    desc = "\n".join(describe_tool(n, tools[n] if hasattr(tools, "names") else None, data) for n in _names(tools))
    return data["templates"][template].replace("{tools}", desc)


def check_template(template: str, names: list[str], text: str) -> None:
    """A template without a `{tools}` slot (`calc`) must fit the enabled tools: its own tool (calc
    teaches python) must be enabled, and it describes no other (a tool the prompt never mentions is
    callable but unknown to the model). Templates with the slot describe whatever is enabled."""
    if "{tools}" in text:
        return
    need = [n for n in TASK_TOOLS.get(template, ()) if n not in names]
    if need:
        raise ArpoError(f"prompt template {template!r} is written for the {', '.join(need)} tool, which is not "
                        f"enabled (tools: {', '.join(names) or 'none'}); enable it or choose another template "
                        f"({', '.join(k for k, v in TASK_TOOLS.items() if set(v) <= set(names)) or 'both'})")
    extra = [n for n in names if n not in TASK_TOOLS.get(template, ())]
    if extra:
        raise ArpoError(f"prompt template {template!r} describes no tools, so {', '.join(extra)} would be "
                        "callable but never described to the model; choose a template with a {tools} slot "
                        "(math, search, both)")


def render_prompt(tokenizer, question: str, system: str, tools=None, tool_format: str = "tags") -> list[int]:
    """Token ids of system + user turn + the assistant header, via the tokenizer's chat template.
    json format: the tools' schemas go to the template (`tools=`); a template without tool support
    gets the hermes tools block appended to the system prompt."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    kw = {}
    if tool_format == "json" and tools is not None and len(_names(tools)):
        from arpo.tools.formats import hermes_system_block, template_supports_tools, tool_schema

        if template_supports_tools(tokenizer):
            kw["tools"] = [tool_schema(tools[n]) for n in _names(tools)]
        else:
            messages[0]["content"] = f"{system}\n\n{hermes_system_block(tools)}"
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **kw)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def prompts_for(examples, tokenizer, tools, template: str | None, tool_format: str = "tags") -> list[list[int]]:
    """Rendered prompts. `tools`: a ToolRegistry (its tools describe themselves) or tool names.
    Without an explicit template, a math example gets the `math` prompt (python) and a QA example
    the `search` prompt when those tools are enabled — the prompts the cold-start SFT data (arpo
    sft-data) uses — else the template that matches the tools. The task's template leaves out the
    other built-in tool, never the user's own (plug-in, MCP) tools: every enabled tool of those is
    described."""
    out = []
    all_names = _names(tools)
    for ex in examples:
        tmpl, names = template, all_names
        if tmpl is None:
            tmpl = {"math": "math", "qa": "search"}.get(ex.get("task"), "")
            if tmpl and set(TASK_TOOLS[tmpl]) <= set(all_names) and len(all_names) > 1:
                names = list(TASK_TOOLS[tmpl]) + [n for n in all_names if n not in BUILTIN_TOOLS]
            else:
                tmpl = default_template(all_names)
        sub = _Subset(tools, names) if hasattr(tools, "names") else names
        out.append(render_prompt(tokenizer, ex["question"], system_prompt(tmpl, sub, tool_format=tool_format),
                                 tools=sub, tool_format=tool_format))
    return out


class _Subset:
    """A registry restricted to some of its tools (for one prompt's description)."""

    def __init__(self, reg, names):
        self.reg, self.names = reg, list(names)

    def __getitem__(self, n):
        return self.reg[n]
