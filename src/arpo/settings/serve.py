"""`arpo serve agent`'s settings (the server: serve/app.py): the model, the agent and its tools with
serve's defaults, the engine, batching and the HTTP server."""

from __future__ import annotations

from dataclasses import dataclass, field

from arpo.settings.agent import AgentConfig, ToolsConfig, agent_defaults, tools_defaults

MAX_REQUEST_BYTES = 4 * 2**20  # a request body over this gets HTTP 413 (a 128k-token context is ~0.5 MB of text)


@dataclass
class ServeConfig:
    model: str = "smollm2-135m-instruct"  # HF dir, built-in name, checkpoint or run dir (its latest checkpoint)
    served_model_name: str | None = None  # the `model` clients ask for (default: from `model`)
    # the agent and its tools: the sections of settings/agent.py, with serve's defaults (settings.COMMAND_DEFAULTS:
    # sampling of a request that sets none; max_response_tokens: the budget of a request without max_tokens)
    agent: AgentConfig = field(default_factory=lambda: agent_defaults("serve"))
    tools: ToolsConfig = field(default_factory=lambda: tools_defaults("serve"))  # the tools it may call (no cache)
    template: str | None = None  # system-prompt template (default: from the tools)
    trust_run_config: bool = False  # a run dir's chat template renders (bounded) only with --trust-run-config
    engine: str = "hf"  # hf | vllm | vllm_server (running vLLM servers that serve `model`: `servers`)
    servers: list[str] = field(default_factory=list)  # vllm_server: the servers' base URLs
    device: str = "auto"  # auto | cpu | cuda | cuda:N (hf: where the model runs)
    max_batch: int = 64  # conversations decoded together; more wait in a queue
    max_waiting: int = 1024  # beyond this many queued conversations, requests get HTTP 503
    api_key: str | None = None  # if set, requests need `Authorization: Bearer <api_key>`
    max_request_bytes: int = MAX_REQUEST_BYTES  # larger request bodies get HTTP 413
    host: str = "127.0.0.1"  # the address the HTTP server listens on (0.0.0.0: every interface)
    port: int = 8000  # its port
    log_level: str = "info"  # uvicorn's log level: critical | error | warning | info | debug | trace
