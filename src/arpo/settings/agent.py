"""The agent's sections: the tools it may call and one trajectory's budget and sampling, and the one
place where a command's defaults differ from train's (COMMAND_DEFAULTS). The agent commands' flags
(chat, eval, serve agent, sft-data, tool) are made from these two sections (commands/agent_flags.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from arpo.config import from_dict
from arpo.errors import ArpoError, require
from arpo.settings.web import WebConfig, require_web_keys

KNOWN_TOOLS = ("python", "search", "web_search", "browse")  # the built-in tools (tools.build_tools makes them)

# The tools' defaults, in one place: ToolsConfig (every command's tools section) and tools.build_tools
# (library callers) both take them from here.
PYTHON_TIMEOUT_S = 5.0  # wall-clock limit of one python call
MAX_OUTPUT_CHARS = 2000  # python output cut to this many characters (marked)
SEARCH_TOP_K = 3  # passages per search (the reference's 10 x 1000 is set in configs/gpu/)
SEARCH_MAX_CHARS = 300  # characters per passage


@dataclass
class ToolOptions:
    """The options of one of your own tools (`tools.options.NAME`, NAME its function's or class's name or
    its snake_case tool name; tools/plugins/function.py runs them)."""

    timeout_s: float = 30.0  # a call running longer becomes an error result (the thread is abandoned)
    max_concurrency: int = 8  # calls of this tool that may run at once (others wait their turn)
    max_output_chars: int = 4000  # the result is cut here, with a marker
    cache: bool = False  # answer identical calls once (tools.cache must be on; only tools without side effects)

    def validate(self, key: str = "tools.options.NAME") -> None:
        for name in ("timeout_s", "max_concurrency", "max_output_chars"):
            v = getattr(self, name)
            require(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, f"{key}.{name}",
                    f"must be a number > 0, got {v!r}")


def tool_options(value: dict | None, key: str = "tools.options.NAME") -> ToolOptions:
    """ToolOptions from a library caller's dict of its keys (a config file's are parsed with the rest of
    its config): unknown keys and wrong types are errors naming `key`.<name>."""
    return from_dict(ToolOptions, dict(value or {}), prefix=f"{key}.")


@dataclass
class ToolsConfig:
    enabled: list[str] = field(default_factory=lambda: ["python"])  # python, search, web_search, browse, mod.path:fn
    python_timeout_s: float = PYTHON_TIMEOUT_S  # wall-clock limit of one python call
    python_session: bool = False  # python keeps variables and files per trajectory, forking with the tree
    max_output_chars: int = MAX_OUTPUT_CHARS  # python output cut to this many characters (marked)
    search_index: str | None = None  # local index dir (default: $ARPO_CACHE_DIR/indexes/hotpotqa)
    search_url: str | None = None  # a retrieval server instead of the local index (arpo serve retriever)
    search_top_k: int = SEARCH_TOP_K  # passages per search (reference 10; the same default in eval/chat/tool/sft-data)
    search_max_chars: int = SEARCH_MAX_CHARS  # characters per passage (reference 1000)
    cache: bool = True  # answer identical calls once (successful results only; tools/cache.py)
    cache_path: str | None = None  # persist the cache here (JSON) across runs
    # your own tools' options by tool name: {NAME: {timeout_s, max_concurrency, max_output_chars, cache}}
    # (ToolOptions above; a name that is none of your enabled tools is an error)
    options: dict[str, ToolOptions] = field(default_factory=dict)
    mcp: list[dict] = field(default_factory=list)  # MCP servers: {command: ..., args: [...], env: {...}} or {url: ...}
    # web_search / browse: the provider, its limits, browse's and the summarizer's (settings/web.py);
    # the defaults: the local web of `arpo web serve` at http://127.0.0.1:8090
    web: WebConfig = field(default_factory=WebConfig)

    def validate(self) -> None:
        for t in self.enabled:
            if t not in KNOWN_TOOLS and ":" not in t:
                raise ArpoError(f"tools.enabled: unknown tool {t!r}; available: {', '.join(KNOWN_TOOLS)} or your "
                                "own as module.path:function")
        for i, m in enumerate(self.mcp):
            require(isinstance(m, dict) and ("command" in m or "url" in m), f"tools.mcp[{i}]",
                    "needs a command (stdio server) or a url (HTTP server)")

        for name, opts in self.options.items():
            opts.validate(f"tools.options.{name}")
        self.web.validate()  # errors name tools.web.<key>
        require(self.python_timeout_s > 0, "tools.python_timeout_s", f"must be > 0, got {self.python_timeout_s}")
        for key in ("max_output_chars", "search_top_k", "search_max_chars"):
            require(getattr(self, key) >= 1, f"tools.{key}", f"must be >= 1, got {getattr(self, key)}")

    def check_keys(self) -> None:
        """The web provider's key is set when web_search is on (settings/web.py require_web_keys):
        tools.tools_from_config calls it, and train before its model loads."""
        require_web_keys(self.enabled, self.web)


@dataclass
class AgentConfig:
    max_tool_calls: int = 5  # tool calls per trajectory; a call beyond this many ends it
    max_response_tokens: int = 1024  # response budget in tokens, tool results included
    temperature: float = 1.0  # sampling temperature; 0 = greedy (training: spec §2 uses 1.0)
    top_p: float = 1.0  # sampling: nucleus probability mass (1 = off)
    top_k: int = 0  # sampling: keep the k most likely tokens (0 = off)
    tool_workers: int = 8  # tool calls that may run at once
    # when a tool result joins its sequence: step (each engine step waits for its pending calls, so
    # a seed gives the same run: docs/reproducibility.md) | arrival (as soon as done: faster with slow
    # tools, but timing changes the trees)
    tool_delivery: str = "step"
    # step: a result joins exactly this many engine steps after its call (waiting if the call is slower),
    # so the batch decodes on meanwhile; 0: the step that made the call waits for it (measured cost:
    # docs/reproducibility.md; set a lag for a slow tool or a fast engine)
    tool_delivery_lag: int = 0
    tool_format: str = "tags"  # tags (<name>input</name>, the paper's) | json (native function calling, hermes)
    result_template: str | None = None  # tags: how a result is appended, "{output}" the result (None: spec §1's)
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in the sequence (vLLM's rule); 1 = off
    # a call beyond max_tool_calls is not run; the model is told so and gets one more turn to answer
    # (Search-R1's final turn), instead of the trajectory ending at the cap (rollout/agent.py)
    final_answer_turn: bool = False

    def validate(self) -> None:
        require(self.max_tool_calls >= 0, "agent.max_tool_calls", f"must be >= 0, got {self.max_tool_calls}")
        require(self.max_response_tokens >= 1, "agent.max_response_tokens",
                f"must be >= 1, got {self.max_response_tokens}")
        require(self.temperature >= 0, "agent.temperature", f"must be >= 0 (0 = greedy), got {self.temperature}")
        require(0 < self.top_p <= 1, "agent.top_p", f"must be in (0, 1], got {self.top_p}")
        require(self.top_k >= 0, "agent.top_k", f"must be >= 0 (0 = off), got {self.top_k}")
        require(self.tool_workers >= 1, "agent.tool_workers", f"must be >= 1, got {self.tool_workers}")
        require(self.tool_delivery in ("step", "arrival"), "agent.tool_delivery",
                f"{self.tool_delivery!r}; choose step (reproducible) or arrival")
        require(self.tool_delivery_lag >= 0, "agent.tool_delivery_lag", f"must be >= 0, got {self.tool_delivery_lag}")
        require(self.tool_format in ("tags", "json"), "agent.tool_format", f"{self.tool_format!r}; choose tags or json")
        require(self.result_template is None or "{output}" in self.result_template, "agent.result_template",
                f"must contain {{output}}, got {self.result_template!r}")
        require(self.repetition_penalty > 0, "agent.repetition_penalty", f"must be > 0 (1 = off), got "
                f"{self.repetition_penalty}")


# The one place where a command's defaults differ from the sections' (train's), each with its reason.
# `--help` of each command shows the value in use; a flag, the run dir or a template still win.
COMMAND_DEFAULTS: dict[str, dict[str, dict]] = {
    "train": {},
    # greedy: deterministic numbers that compare across runs (--samples > 1 needs --temperature > 0)
    "eval": {"agent": {"temperature": 0.0}, "tools": {"cache": False}},
    # sampling of an answer shown to a person: Qwen's recommended chat settings
    "chat": {"agent": {"temperature": 0.6, "top_p": 0.95, "top_k": 20}, "tools": {"cache": False}},
    # the same, for a request that sets no sampling of its own; no cache shared between clients
    "serve": {"agent": {"temperature": 0.6, "top_p": 0.95, "top_k": 20}, "tools": {"cache": False}},
    # rejection sampling explores a little (0.8); gsm8k --style stepwise merges into at most 3 calls
    "sft-data": {"agent": {"temperature": 0.8, "max_tool_calls": 3}, "tools": {"cache": False}},
    "tool": {"tools": {"cache": False}},  # one call by hand: always run it
}


def agent_record(template: str | None, tools: ToolsConfig, tools_chosen: bool, agent: AgentConfig) -> dict:
    """What a result file (`arpo eval --out`, `arpo chat --json`) records about the agent that produced it."""
    return {"template": template, "tools": list(tools.enabled) if tools_chosen else None, "mcp": list(tools.mcp),
            "max_tool_calls": agent.max_tool_calls, "max_response_tokens": agent.max_response_tokens,
            "temperature": agent.temperature, "top_p": agent.top_p, "top_k": agent.top_k,
            "repetition_penalty": agent.repetition_penalty, "result_template": agent.result_template,
            "tool_format": agent.tool_format}


def command_defaults(command: str, section: str) -> dict:
    """{field: value} where `command`'s default of `section` (agent | tools) differs from the dataclass's."""
    return dict(COMMAND_DEFAULTS[command].get(section, {}))


def agent_defaults(command: str, **over) -> AgentConfig:
    """The agent section with `command`'s defaults (COMMAND_DEFAULTS), `over` on top."""
    return AgentConfig(**{**command_defaults(command, "agent"), **over})


def tools_defaults(command: str, **over) -> ToolsConfig:
    """The tools section with `command`'s defaults (COMMAND_DEFAULTS), `over` on top."""
    return ToolsConfig(**{**command_defaults(command, "tools"), **over})
