"""What a run directory says about running its agent, shared by `arpo chat`, `arpo eval` and `arpo serve
agent` (and `arpo sft-data rejection`): with `--model RUN_DIR` (or one of its checkpoints) the run's
tools section, prompt template, call format and budgets are the defaults of those commands
(commands/agent_flags.py), so a model trained on the `calc` prompt is asked with it.

Train runs keep them in RUN_DIR/config.yaml (tools.*, agent.*, data.template); SFT runs in
RUN_DIR/agent.yaml, written from the prompts of the SFT rows (recipes/sft.py `agent_yaml`).

A run directory is data, not code (issue 37): runs are shared and downloaded, and loading one must
not start its commands or import its modules. By default only the weights, the template and plain
settings come from a run; the settings that run code or reach the network (`code_settings`: MCP
servers, your own tools' modules and their options, tools.search_url, tools.web's URLs, key
variables and address rules) are left out with a message naming each one and TRUST_FLAG. With
TRUST_FLAG (one definition, `add_trust_flag`, for every command that loads a run) they are taken,
after arpo prints each command it will start, module it will import and server it will reach; a
run's web key variables are still limited to their provider's own (settings/web.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from arpo.errors import ArpoError
from arpo.runs import TRUST_FLAG as TRUST_FLAG  # re-exported: the commands' one definition lives with the runs
from arpo.runs import run_dir_of as run_dir_of  # re-exported


def _known_keys(path: Path, section: str, sec: dict) -> None:
    """A run's tools / agent keys are the sections' fields: an unknown one (a typo) is an error naming
    the file, as `arpo train` makes it (chat / eval dropped it silently)."""
    from dataclasses import fields

    from arpo.settings.agent import AgentConfig, ToolsConfig

    valid = {f.name for f in fields(AgentConfig if section == "agent" else ToolsConfig)}
    bad = sorted(k for k in sec if k not in valid)
    if bad:
        raise ArpoError(f"{path}: unknown config key {', '.join(f'{section}.{k}' for k in bad)!s}; valid keys: "
                        + ", ".join(f"{section}.{k}" for k in sorted(valid)))


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
                _known_keys(p, section, sec)
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


def tools_words(tcfg, names) -> str:
    """The tools as a command reports them: `search` says which index it searches (rows without
    --tools were searched in the built-in HotpotQA index, and nothing said so)."""
    out = []
    for n in names:
        if n == "search" and tcfg.search_url:
            out.append(f"search (the retriever at {tcfg.search_url})")
        elif n == "search":
            out.append(f"search (the index {tcfg.search_index})" if tcfg.search_index else
                       "search (the built-in HotpotQA index; --search-index DIR for yours)")
        else:
            out.append(n)
    return ",".join(out)


def add_trust_flag(p) -> None:
    """The one definition of TRUST_FLAG, for every command that loads a run's settings."""
    p.add_argument(TRUST_FLAG, dest="trust_run_config", action="store_true",
                   help="--model RUN_DIR: also take the run's settings that run code or reach the network (its MCP "
                   "servers' commands and URLs, its own tools' modules, imported from the current directory, "
                   "tools.search_url, tools.web's URLs, key variables and address rules); each is printed before "
                   "it runs. Without it a run gives only its weights, template and plain settings: a downloaded "
                   "run is data, not code")


def _run_plugin(name) -> bool:
    """A plug-in tool spec (module:attr) whose module is not arpo's own. arpo's own (e.g. the hop2 quick
    start's `arpo.data.hop2:lookup`) runs no code from the run: the package is imported already, so its
    submodules come from the installed arpo whatever the current directory holds."""
    name = str(name)
    if name.startswith(("env:", "openenv:", "vf:")):  # an environment (envs/): its module, or a server
        target = name.partition(":")[2].split("?")[0]
        return name.startswith("openenv:http") or target.partition(":")[0].split(".")[0] != "arpo"
    module = name.partition(":")[0]
    return ":" in name and module.split(".")[0] != "arpo"


def code_settings(tools: dict) -> list[tuple[str, str]]:
    """(key, what it does) for each setting of a run's tools section that runs code or reaches the
    network: what TRUST_FLAG admits and what arpo prints before using it."""
    import dataclasses
    import os
    import shlex

    from arpo.settings.web import RUN_TRUST_KEYS, WebConfig

    out: list[tuple[str, str]] = []
    for i, m in enumerate(tools.get("mcp") or []):
        m = m if isinstance(m, dict) else {"command": m}
        if "command" in m:
            cmd = shlex.join([str(m["command"]), *map(str, m.get("args") or [])])
            extra = (f" in {m['cwd']}" if m.get("cwd") else "") + (
                f" with environment {', '.join(map(str, m['env']))}" if isinstance(m.get("env"), dict) else "")
            out.append((f"tools.mcp[{i}]", f"starts the command: {cmd}{extra}"))
        else:
            out.append((f"tools.mcp[{i}]", f"connects to the MCP server {m.get('url')} (its tools join the agent's)"))
    plugins = [str(n) for n in tools.get("enabled") or [] if _run_plugin(n)]
    for n in plugins:
        target = n.partition(":")[2].split("?")[0]
        if n.startswith("openenv:http"):  # an environment (envs/spec.py): a server it sends the actions to
            out.append(("tools.enabled", f"sends the model's actions to the OpenEnv server {target} (the tool {n})"))
            continue
        mod, kind = (target.partition(":")[0], f"the environment {n}") if n.startswith(("env:", "openenv:", "vf:")) \
            else (n.partition(":")[0], f"the tool {n}")
        out.append(("tools.enabled", f"imports the module {mod} ({kind}) from the current directory {os.getcwd()} "
                    "or the Python path"))
    if tools.get("options"):
        out.append(("tools.options", f"options of the run's own tools: {', '.join(map(str, tools['options']))}"))
    if tools.get("search_url"):
        out.append(("tools.search_url", f"search sends its queries to {tools['search_url']}"))
    got = tools.get("web")
    web: dict = got if isinstance(got, dict) else {}
    provider = web.get("provider", WebConfig.provider)
    what = {"url": f"web_search ({provider}) sends its queries and its key to {web.get('url')}",
            "api_key_env": f"web_search sends the value of ${web.get('api_key_env')} as its key",
            "summarizer_url": f"browse sends page text and its key to the summarizer at {web.get('summarizer_url')}",
            "summarizer_key_env": f"browse sends the value of ${web.get('summarizer_key_env')} to the summarizer",
            "allow_private": f"browse may fetch private and loopback addresses ({web.get('allow_private')})",
            "allow_hosts": f"browse may fetch these private hosts: {web.get('allow_hosts')}"}
    # a run saves its whole tools.web (issue 64): a key at its default sends nothing anywhere
    default = dataclasses.asdict(WebConfig())
    out += [(f"tools.web.{k}", what[k]) for k in RUN_TRUST_KEYS if web.get(k) not in (None, default[k])]
    return out


def plain_settings(run: dict) -> dict:
    """`run` (run_settings) without its code_settings: the tools section keeps its built-in tools and
    plain keys (and the plug-in tools arpo ships); MCP servers, your own tools (and their options), search_url
    and tools.web's RUN_TRUST_KEYS go."""
    from arpo.settings.web import RUN_TRUST_KEYS

    tools = run.get("tools")
    if not isinstance(tools, dict):
        return run
    kept = {k: v for k, v in tools.items() if k not in ("mcp", "options", "search_url")}
    if isinstance(tools.get("enabled"), list):
        kept["enabled"] = [n for n in tools["enabled"] if not _run_plugin(n)]
    if isinstance(tools.get("web"), dict):
        kept["web"] = {k: v for k, v in tools["web"].items() if k not in RUN_TRUST_KEYS}
        if not kept["web"]:
            del kept["web"]
    return {**run, "tools": kept}


def admit(run: dict, model: str | None, trusted: bool, command: str, overridden: frozenset[str] = frozenset()) -> dict:
    """The run's settings a command may use: with `trusted` (TRUST_FLAG) all of them, after printing
    what will run and checking the run's key variables (settings/web.py check_run_key_envs); without it
    plain_settings, with a message naming what was left out and the flag. Both on stderr. Settings the
    command line sets itself (`overridden`, e.g. tools.web.url from --web-url) are not named: the
    command does not use the run's value either way."""
    got = run.get("tools")
    tools: dict = got if isinstance(got, dict) else {}
    risky = code_settings(tools)
    if not risky:
        return run
    if not trusted:
        risky = [(k, v) for k, v in risky if k not in overridden]
        if not risky:
            return plain_settings(run)
    where = run_dir_of(model) if model else None
    name = f"the run {where.resolve()}" if where is not None else "the run"
    lines = "\n".join(f"  {k}: {v}" for k, v in risky)
    if trusted:
        from arpo.settings.web import check_run_key_envs

        if isinstance(tools.get("web"), dict):
            check_run_key_envs(tools["web"], where=f"{name}: tools.web")
        print(f"arpo {command}: {TRUST_FLAG}: using the settings of {name} that run code or reach the network:\n"
              f"{lines}", file=sys.stderr)
        return run
    print(f"arpo {command}: {name} has settings that run code or reach the network; they were NOT loaded (a run "
          f"dir is data; read them, then pass {TRUST_FLAG} to use them):\n{lines}", file=sys.stderr)
    return plain_settings(run)
