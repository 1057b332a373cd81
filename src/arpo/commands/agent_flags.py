"""The agent commands' flags (chat, eval, serve agent, sft-data, tool), made in this one place from the
`tools`, `agent` and `run` sections of settings/: a flag's help is its field's documentation, its
default the field's default or the command's (settings.COMMAND_DEFAULTS), and `--help` shows it.

How a command's settings are resolved (`resolve`), first wins:
  1. a flag given on the command line (--tools, --max-response-tokens, --web-*, ...)
  2. --tools-config FILE: a YAML `tools:` section, train's schema (tools.mcp servers, tools.options of
     your own tools, tools.web, ...), the way to give chat / eval / serve / tool MCP tools
  3. the run dir of --model RUN_DIR (from_run.py): its tools section's plain settings (the cache left
     out), its template and the agent keys in RUN_AGENT_KEYS (a run's sampling is train's exploration,
     so sampling is not taken from it); its settings that run code or reach the network (MCP servers,
     your own tools, search_url, tools.web's URLs and key variables) only with --trust-run-config
     (from_run.admit: a run dir is data, not code)
  4. a released checkpoint's template (--template arpo-reasoning, ...): its tools, budgets and sampling
  5. the command's default (settings.COMMAND_DEFAULTS), then the section's (train's)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields

from arpo.commands import NONNEG, NONNEG_INT, POS_INT, POSITIVE, PROB, TOOL_LIST, deprecated
from arpo.settings import AgentConfig, RunConfig, ToolsConfig, command_defaults

# flag dest -> (section, field, argparse type); the flag is --dest with '-' for '_'
FLAGS: dict[str, tuple[str, str, object]] = {
    "tools": ("tools", "enabled", TOOL_LIST),
    "session": ("tools", "python_session", bool),
    "python_timeout": ("tools", "python_timeout_s", POSITIVE),
    "max_output_chars": ("tools", "max_output_chars", POS_INT),
    "search_index": ("tools", "search_index", str),
    "search_url": ("tools", "search_url", str),
    "search_top_k": ("tools", "search_top_k", POS_INT),
    "search_max_chars": ("tools", "search_max_chars", POS_INT),
    "tool_format": ("agent", "tool_format", ["tags", "json"]),
    "max_tool_calls": ("agent", "max_tool_calls", NONNEG_INT),
    "final_answer_turn": ("agent", "final_answer_turn", bool),
    "max_response_tokens": ("agent", "max_response_tokens", POS_INT),
    "temperature": ("agent", "temperature", NONNEG),
    "top_p": ("agent", "top_p", PROB),
    "top_k": ("agent", "top_k", NONNEG_INT),
    "repetition_penalty": ("agent", "repetition_penalty", POSITIVE),
    "seed": ("run", "seed", int),
}
SECTIONS = {"tools": ToolsConfig, "agent": AgentConfig, "run": RunConfig}
SAMPLING = ("temperature", "top_p", "top_k", "repetition_penalty")  # never taken from a run dir
RUN_AGENT_KEYS = ("tool_format", "max_tool_calls", "final_answer_turn", "max_response_tokens", "result_template")
RUN_TOOLS_SKIP = ("cache", "cache_path")  # training's tool cache; an interactive command runs every call

_AGENT = ["tools", "session", "tool_format", "template", "max_tool_calls", "final_answer_turn", "max_response_tokens",
          "temperature",
          "top_p", "top_k", "repetition_penalty", "search_index", "search_url", "search_top_k",
          "search_max_chars", "tools_config", "trust_run_config"]
# the flags of each command; the commands marked in RESOLVING take the run dir's and the template's
# settings, so their flags default to None (not given) and the help says the chain
COMMAND_FLAGS = {
    "chat": _AGENT + ["seed"],
    "eval": _AGENT + ["seed"],
    "serve": _AGENT,
    "sft-data": ["tools", "tool_format", "template", "max_tool_calls", "max_response_tokens", "temperature",
                 "search_index", "search_top_k", "search_max_chars", "trust_run_config"],
    "tool": ["python_timeout", "max_output_chars", "search_index", "search_url", "search_top_k", "search_max_chars",
             "tools_config"],
}
RESOLVING = ("chat", "eval", "serve")
# where a flag means something narrower in one command, what its help says first
USE = {("sft-data", "tools"): "tools: the worked examples' tools; rejection: the tools to sample with (default: "
       "the task's).", ("sft-data", "tool_format"): "tools: how the calls are written.",
       ("sft-data", "template"): "tools: the system prompt.",
       ("sft-data", "max_tool_calls"): "gsm8k --style stepwise: at most this many calls.",
       ("sft-data", "max_response_tokens"): "rejection:", ("sft-data", "temperature"): "rejection:",
       ("sft-data", "search_index"): "hotpotqa, rejection:",
       ("serve", "temperature"): "of a request that sets none:", ("serve", "top_p"): "of a request that sets none:",
       ("serve", "top_k"): "of a request that sets none:", ("serve", "repetition_penalty"): "of a request "
       "that sets none:", ("serve", "max_response_tokens"): "of a request without max_tokens:"}
# eval alone: with no tools from a flag, the run or a template, each dataset gets its task's tools
AUTO_TOOLS = {"eval": "python for math rows, search for QA rows"}


def default_of(command: str, dest: str):
    """The value `command` uses for flag `dest` when nothing else sets it."""
    section, name, _ = FLAGS[dest]
    over = command_defaults(command, section) if section != "run" else {}
    if name in over:
        return over[name]
    f = next(f for f in fields(SECTIONS[section]) if f.name == name)
    return f.default_factory() if callable(f.default_factory) else f.default


def _shown(v) -> str:
    return ",".join(v) if isinstance(v, list) else str(v)


def _help(command: str, dest: str) -> str:
    from arpo.config import field_docs

    section, name, _ = FLAGS[dest]
    doc = field_docs(SECTIONS[section]).get(name, "")
    if dest == "tools":  # the flag's own format: a comma-separated list
        doc = ("comma-separated tools: python, search, web_search, browse, your own as module.path:function; "
               "none: no tools")
    if (command, dest) in USE:
        doc = f"{USE[command, dest]} {doc}"
    if command not in RESOLVING:
        return doc
    v = default_of(command, dest)
    value = AUTO_TOOLS[command] if dest == "tools" and command in AUTO_TOOLS else None if v is None else _shown(v)
    chain = []
    if section == "tools" or dest in RUN_AGENT_KEYS:
        chain.append("the run's")
    if dest in ("tools", "max_tool_calls", "max_response_tokens") or dest in SAMPLING:
        chain.append("the template's")
    if section == "run":
        return doc
    return f"{doc} (default: {', else '.join(chain + ([value] if value is not None else []))})"


def add_agent_flags(p, command: str, only: list[str] | None = None) -> None:
    """Add `command`'s flags (COMMAND_FLAGS, or `only`) to parser `p`, from the sections' fields."""
    resolving = command in RESOLVING
    for dest in only or COMMAND_FLAGS[command]:
        flag = "--" + dest.replace("_", "-")
        if dest == "template":
            if not resolving:
                p.add_argument(flag, default=None, help=USE.get((command, dest), "") + " prompt template: math, calc, "
                               "search, both, deep_search (default: chosen from the tools)")
                continue
            p.add_argument(flag, default=None, help="prompt template: math, calc, search, both, deep_search, or a "
                           "released ARPO checkpoint's (arpo-reasoning, arpo-deepsearch, ...: also its tools, budgets "
                           "and sampling) (default: the run's, else chosen from the tools and the task)")
            continue
        if dest == "trust_run_config":
            from arpo.commands.from_run import add_trust_flag

            add_trust_flag(p)
            continue
        if dest == "tools_config":
            p.add_argument(flag, default=None, metavar="FILE",
                           help="a YAML tools section (train's `tools:` keys: enabled, mcp servers, options of your "
                           "own tools, web, ...), e.g. to give this command MCP tools; flags win over it")
            continue
        section, name, kind = FLAGS[dest]
        default = None if (resolving or dest in ("tools", "template")) else default_of(command, dest)
        if dest == "seed":
            default = default_of(command, dest)
        if dest == "python_timeout" and command == "tool":
            flag = "--timeout"  # `arpo tool python --timeout 2`: the tool's own name for it
        if kind is bool:
            p.add_argument(flag, dest=dest, action="store_true", default=None, help=_help(command, dest)
                           + ("" if resolving else f" (default: {default})"))
        elif isinstance(kind, list):
            p.add_argument(flag, dest=dest, default=default, choices=kind, help=_help(command, dest))
        else:
            p.add_argument(flag, dest=dest, type=kind, default=default, help=_help(command, dest))
        if dest == "max_response_tokens" and command in ("chat", "eval"):
            deprecated(p, "--max-new-tokens", "--max-response-tokens", dest="max_response_tokens", type=POS_INT)
    if "tools" in (only or COMMAND_FLAGS[command]) or command == "tool":
        from arpo.commands.web import add_web_args

        add_web_args(p)


@dataclass
class Resolved:
    agent: AgentConfig
    tools: ToolsConfig
    template: str | None  # None: chosen from the tools (and the task)
    source: str  # where the template comes from, for the line that shows it
    tools_chosen: bool  # the tools came from a flag, a file, the run or a template (eval: else per task)


def read_tools_config(path: str | None) -> dict:
    """The tools section in YAML file `path` ({} without one): a file with a `tools:` key (a train config
    works) or the section's keys at the top level."""
    if not path:
        return {}
    from pathlib import Path

    import yaml

    from arpo.errors import ArpoError

    p = Path(path).expanduser()
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except OSError as e:
        raise ArpoError(f"--tools-config {p}: cannot read it ({e.strerror or e})") from e
    except UnicodeDecodeError as e:  # was a traceback
        line = p.read_bytes()[: e.start].count(b"\n") + 1
        raise ArpoError(f"--tools-config {p}:{line}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except yaml.YAMLError as e:
        raise ArpoError(f"--tools-config {p}: invalid YAML: {getattr(e, 'problem', e)}") from e
    if not isinstance(data, dict):
        raise ArpoError(f"--tools-config {p}: expected a mapping (a `tools:` section), got {type(data).__name__}")
    sec = data.get("tools", data) if "tools" in data else data
    if not isinstance(sec, dict):
        raise ArpoError(f"--tools-config {p}: `tools` must be a mapping of tools.* keys")
    return dict(sec)


def given(args, command: str) -> dict[str, dict]:
    """{section: {field: value}} of the flags given on the command line (None: not given)."""
    from arpo.commands.web import web_options

    out: dict[str, dict] = {"tools": {}, "agent": {}, "run": {}}
    for dest in COMMAND_FLAGS[command]:
        if dest not in FLAGS or getattr(args, dest, None) is None:
            continue
        section, name, _ = FLAGS[dest]
        v = getattr(args, dest)
        if dest == "tools":
            v = [t for t in v.split(",") if t]
        out[section][name] = v
    web = web_options(args)
    if web:
        out["tools"]["web"] = web
    return out


def resolve(args, command: str, run: dict | None = None) -> Resolved:
    """The agent and tools sections of `command` (the order in this module's docstring). `run`: the run
    dir's settings (from_run.run_settings; default: those of args.model)."""
    from arpo.commands.from_run import admit, run_settings
    from arpo.config import from_dict
    from arpo.data.prompts import checkpoint_template_for, template_defaults

    model = getattr(args, "model", None) if command in RESOLVING else None  # sft-data's --model: a sampler
    run = run_settings(model) if run is None and model else (run or {})
    # a run dir is data: its code and network settings only with --trust-run-config (printed first)
    flags = given(args, command)
    overridden = frozenset(f"tools.web.{k}" for k in flags["tools"].get("web", {}))
    run = admit(run, model or getattr(args, "model", None), bool(getattr(args, "trust_run_config", False)),
                command, overridden)
    file = read_tools_config(getattr(args, "tools_config", None))
    run_tools = {k: v for k, v in (run.get("tools") or {}).items() if k not in RUN_TOOLS_SKIP}
    web = {**(run_tools.get("web") or {}), **(file.get("web") or {}), **flags["tools"].get("web", {})}
    tools = {**command_defaults(command, "tools"), **run_tools, **file, **flags["tools"]}
    if web:
        tools["web"] = web
    explicit = getattr(args, "template", None)
    if explicit is not None:
        template, source = explicit, "--template"
    elif "enabled" in flags["tools"] or "enabled" in file:
        template, source = None, "chosen from the tools and the task"  # the run's template went with its tools
    else:
        template = run.get("template")
        source = "the run's" if template is not None else "chosen from the tools and the task"
    if template is None and model:
        known = checkpoint_template_for(model)
        if known:
            print(f"arpo: {model} looks like a released ARPO checkpoint; add --template {known} to run it with "
                  "its authors' prompt, tools and sampling", file=sys.stderr)
    tmpl = template_defaults(template)
    if "enabled" not in tools and "tools" in tmpl:
        tools["enabled"] = list(tmpl["tools"])
    chosen = "enabled" in tools
    own_web = {**(file.get("web") or {}), **flags["tools"].get("web", {})}
    keep_browse_off_the_local_web(tools, model, bool(getattr(args, "trust_run_config", False)), own_web, command)
    run_agent = {k: v for k, v in (run.get("agent") or {}).items() if k in RUN_AGENT_KEYS}
    from_tmpl = {k: v for k, v in tmpl.items() if k != "tools"}  # its budgets, sampling and result format
    agent = {**command_defaults(command, "agent"), **from_tmpl, **run_agent, **flags["agent"]}
    return Resolved(agent=from_dict(AgentConfig, agent, prefix="agent."),
                    tools=from_dict(ToolsConfig, tools, prefix="tools."), template=template, source=source,
                    tools_chosen=chosen)


def keep_browse_off_the_local_web(tools: dict, model: str | None, trusted: bool, own_web: dict, command: str) -> None:
    """A run dir's settings without --trust-run-config (issue 61): browse does not fetch the local web
    (provider local, the default: whatever listens at 127.0.0.1:8090) unless your own --web-provider /
    --web-url or --tools-config names the provider or its URL. `tools` is changed in place; one line on
    stderr says so when browse is enabled."""
    from arpo.commands.from_run import TRUST_FLAG, run_dir_of
    from arpo.settings.web import LOCAL_WEB_URL, WebConfig

    if trusted or not model or run_dir_of(model) is None or "provider" in own_web or "url" in own_web:
        return
    web = dict(tools.get("web") or {})
    if web.get("provider", WebConfig.provider) != "local" or "browse" not in (tools.get("enabled") or []):
        return
    tools["web"] = {**web, "browse_local_web": False}
    print(f"arpo {command}: browse does not fetch the local web at {web.get('url') or LOCAL_WEB_URL} for this run "
          f"(its provider local is the run's setting, not yours): pass --web-provider local, or {TRUST_FLAG}",
          file=sys.stderr)
