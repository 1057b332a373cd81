"""Prompt rendering: system-prompt templates (data, in templates/prompts.yaml) + the tokenizer's own
chat template. The prompt is tokenized once; everything after it is built in token space.

A template is a system prompt (a string, `{tools}` replaced by the tools' descriptions), or a
mapping that also carries the protocol a model was trained with — the released ARPO checkpoints'
templates (`arpo-reasoning`, `arpo-deepsearch`, ...): `system`, and optionally `tools`, `result`
(how a tool result is appended, `{output}` the result), `max_tool_calls`, `max_response_tokens`,
`temperature`, `top_p`, `top_k`, `repetition_penalty` — the defaults `arpo chat/eval --template NAME`
runs with unless a flag says otherwise (`template_spec`, `template_defaults`)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from arpo.errors import ArpoError

DEFAULT_TEMPLATES = Path(__file__).with_name("templates") / "prompts.yaml"
TASK_TOOLS = {"math": ("python",), "calc": ("python",), "search": ("search",), "both": ("python", "search"),
              "deep_search": ("web_search", "browse"), "webhop": ("web_search", "browse"),
              "webhop3": ("web_search", "browse")}
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


@dataclass(frozen=True)
class TemplateSpec:
    system: str
    tools: tuple[str, ...] | None = None
    result: str | None = None  # e.g. "<result>{output}</result>"; None: arpo's "\n<result>\n{output}\n</result>\n"
    max_tool_calls: int | None = None
    max_response_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None


AGENT_KEYS = ("tools", "max_tool_calls", "max_response_tokens", "temperature", "top_p", "top_k", "repetition_penalty")


def template_spec(name: str, path: str | None = None) -> TemplateSpec:
    """A template by name; a mapping's keys are checked (an unknown one is an error naming it)."""
    data = load_templates(path)
    if name not in data["templates"]:
        raise ArpoError(f"unknown prompt template {name!r}; choose one of {sorted(data['templates'])}")
    t = data["templates"][name]
    where = f"{path or DEFAULT_TEMPLATES}: templates.{name}"
    if isinstance(t, str):
        return TemplateSpec(system=t)
    if not isinstance(t, dict) or not isinstance(t.get("system"), str):
        raise ArpoError(f"{where}: a template is a string or a mapping with a 'system' string")
    known = {f.name for f in fields(TemplateSpec)}
    bad = sorted(set(t) - known)
    if bad:
        raise ArpoError(f"{where}.{bad[0]}: unknown key; a template may set {', '.join(sorted(known))}")
    if t.get("result") is not None and "{output}" not in str(t["result"]):
        raise ArpoError(f"{where}.result: must contain {{output}} (where the tool result goes)")
    if t.get("tools") is not None and not isinstance(t["tools"], list):
        raise ArpoError(f"{where}.tools: expected a list of tool names")
    return TemplateSpec(**{**t, "tools": tuple(t["tools"]) if t.get("tools") is not None else None})


def template_defaults(name: str | None, path: str | None = None) -> dict:
    """The agent settings a template carries ({} for a plain system prompt or no template)."""
    if not name:
        return {}
    spec = template_spec(name, path)
    out = {k: getattr(spec, k) for k in AGENT_KEYS if getattr(spec, k) is not None}
    if spec.result is not None:
        out["result_template"] = spec.result
    return out


def checkpoint_templates(path: str | None = None) -> dict:
    """The released ARPO checkpoints (Hugging Face ids) -> the template each runs with."""
    return dict(load_templates(path).get("checkpoints") or {})


def checkpoint_template_for(model: str, path: str | None = None) -> str | None:
    """The template of a released ARPO checkpoint named by `model` (its Hub id, or a directory with the
    checkpoint's name, e.g. ./Qwen2.5-7B-ARPO), None for any other model."""
    name = str(model).rstrip("/").rsplit("/", 1)[-1].lower()
    for hf_id, template in checkpoint_templates(path).items():
        if name == hf_id.rsplit("/", 1)[-1].lower():
            return template
    return None


def default_template(tools) -> str:
    """The task family that matches the enabled tools."""
    s = set(_names(tools))
    if s == {"python"}:
        return "math"
    if s == {"search"}:
        return "search"
    if s and s <= {"web_search", "browse"}:
        return "deep_search"
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
        if ":" in name:  # the model would be told to write <module:function>, a tool it can never call
            raise ArpoError(f"{name!r} is a plug-in spec, not a tool's name: render the prompt from the built "
                            "tool registry (tools.tools_from_config(...)), whose tools describe themselves")
        return f"<{name}> input </{name}>"
    fn = tool_schema(tool)["function"]
    desc = " ".join((fn.get("description") or "").strip().split("\n\n")[0].split())
    props = fn.get("parameters", {}).get("properties", {})
    single = tool.single_string_arg
    if single or (len(props) == 1 and next(iter(props.values())).get("type") == "string"):
        return f"<{name}> {single or next(iter(props))} </{name}>: {desc}"
    args = ", ".join(f'"{k}": {v.get("type", "value")}' for k, v in props.items())
    return f"<{name}> {{{args}}} </{name}>: {desc} (the input is a JSON object of these arguments)"


def system_prompt(template: str, tools, path: str | None = None, tool_format: str = "tags") -> str:
    """The system prompt: a template with `{tools}` replaced by the tools' descriptions (tags), or,
    for the json format, by nothing (the chat template or the hermes block describes the tools)."""
    data = load_templates(path)
    if tool_format == "json":
        template = "json" if template in (None, "math", "search", "both", "calc", "deep_search") else template
    spec = template_spec(template, path)
    if tool_format == "json" and spec.result is not None:
        raise ArpoError(f"template {template!r} is the tag protocol its model was trained with (<python>, "
                        "<search>, <result>); use --tool-format tags with it")
    if tool_format != "json":  # json: the chat template or the hermes block describes the tools
        check_template(template, _names(tools), spec.system, spec.tools)
    if "{tools}" not in spec.system:
        return spec.system
    desc = "\n".join(describe_tool(n, tools[n] if hasattr(tools, "names") else None, data) for n in _names(tools))
    return spec.system.replace("{tools}", desc)


def check_template(template: str, names: list[str], text: str, own=None) -> None:
    """A template without a `{tools}` slot (`calc`, the released checkpoints' prompts) must fit the
    enabled tools: it describes no tool beyond its own (`own`, the template's `tools:`, else
    TASK_TOOLS; a tool the prompt never mentions is callable but unknown to the model), and `calc`'s
    own tool (python) must be enabled; a released checkpoint's template may run with a subset of its
    tools. Templates with the slot describe whatever is enabled."""
    if "{tools}" in text:
        return
    declared = own is not None  # a released checkpoint's template: its tools may be a subset (math: python only)
    own = tuple(TASK_TOOLS.get(template, ())) if own is None else tuple(own)
    need = [] if declared else [n for n in own if n not in names]
    if need:
        raise ArpoError(f"prompt template {template!r} is written for the {', '.join(need)} tool, which is not "
                        f"enabled (tools: {', '.join(names) or 'none'}); enable it or choose another template "
                        f"({', '.join(k for k, v in TASK_TOOLS.items() if set(v) <= set(names)) or 'both'})")
    extra = [n for n in names if n not in own]
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
        tmpl, names = _template_of(ex, all_names, template)
        sub = _Subset(tools, names) if hasattr(tools, "names") else names
        out.append(render_prompt(tokenizer, ex["question"], system_prompt(tmpl, sub, tool_format=tool_format),
                                 tools=sub, tool_format=tool_format))
    return out


def _template_of(ex: dict, all_names: list[str], template: str | None) -> tuple[str, list[str]]:
    """(template, the tools its prompt describes) of one example (prompts_for's rule)."""
    if template is not None:
        return template, all_names
    tmpl = {"math": "math", "qa": "search"}.get(ex.get("task", ""), "")
    if tmpl and set(TASK_TOOLS[tmpl]) <= set(all_names) and len(all_names) > 1:
        return tmpl, list(TASK_TOOLS[tmpl]) + [n for n in all_names if n not in BUILTIN_TOOLS]
    return default_template(all_names), all_names


def templates_for(examples, tools, template: str | None) -> list[str]:
    """The templates `prompts_for` gives these examples (what a command reports it uses)."""
    names = _names(tools)
    return list(dict.fromkeys(_template_of(ex, names, template)[0] for ex in examples))


class _Subset:
    """A registry restricted to some of its tools (for one prompt's description)."""

    def __init__(self, reg, names):
        self.reg, self.names = reg, list(names)

    def __getitem__(self, n):
        return self.reg[n]


# ---- how tools are described to the model (the tools layer renders its formats with these) -------
HERMES_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}}\n</tool_call>"
)


def tool_schema(tool) -> dict:
    """A tool's function schema; a tag-only tool (no `schema`) takes one string, `input`."""
    if tool.schema is not None:
        return tool.schema
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": {"type": "object", "required": ["input"],
                                                            "properties": {"input": {"type": "string"}}}}}


def template_supports_tools(tokenizer) -> bool:
    t = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(t, str) and "tools" in t


def hermes_system_block(tools) -> str:
    """The hermes tools block for a chat template without tool support: every tool's schema as JSON."""
    return HERMES_TOOLS.format(tools="\n".join(json.dumps(tool_schema(tools[n]), ensure_ascii=False)
                                               for n in tools.names))
