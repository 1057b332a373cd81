"""The configuration of the two web tools, `web_search` and `browse` (`tools.web` in a config,
`--web-*` / `--browse-*` flags on the command line). The tools themselves are in tools/web/.

    tools:
      enabled: [web_search, browse]
      web:
        provider: local            # ddgs | serper | tavily | brave | exa | searxng | local
        url: http://127.0.0.1:8090 # provider base URL (default: the provider's own; local: arpo web serve)
        top_k: 5

Keys of paid providers come from the environment (`SERPER_API_KEY`, `TAVILY_API_KEY`,
`BRAVE_API_KEY`, `EXA_API_KEY`; `api_key_env` names another variable), never from a file.

A run directory is data, not configuration you wrote (issue 37): `arpo chat / eval / serve agent
--model RUN_DIR` never take the keys in RUN_TRUST_KEYS (where requests and keys go, which addresses
browse may reach) from a run's `tools.web` unless `--trust-run-config` is given, and even then a
run may name only its provider's own key variable (KEY_ENVS; the summarizer's: SUMMARIZER_KEY_ENVS):
a run naming `AWS_SECRET_ACCESS_KEY` is refused (`check_run_key_envs`). Your own `--tools-config`
and flags may name any variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from arpo.config import from_dict
from arpo.errors import ArpoError, require

LOCAL_WEB_URL = "http://127.0.0.1:8090"  # `arpo web serve`'s default address


@dataclass(frozen=True)
class Provider:
    name: str
    url: str  # default base URL
    key_env: str | None  # environment variable of the API key (None: keyless)
    rate: float  # default requests per second (0: unlimited)


PROVIDERS = {
    "ddgs": Provider("ddgs", "", None, 1.0),  # the ddgs package (DuckDuckGo & co, no key); its own HTTP client
    "serper": Provider("serper", "https://google.serper.dev", "SERPER_API_KEY", 5.0),
    "tavily": Provider("tavily", "https://api.tavily.com", "TAVILY_API_KEY", 5.0),
    "brave": Provider("brave", "https://api.search.brave.com", "BRAVE_API_KEY", 1.0),
    "exa": Provider("exa", "https://api.exa.ai", "EXA_API_KEY", 5.0),
    "searxng": Provider("searxng", "http://127.0.0.1:8888", "SEARXNG_API_KEY", 2.0),  # self-hosted; key optional
    "local": Provider("local", LOCAL_WEB_URL, None, 0.0),  # arpo web serve: SearXNG's JSON API
}

# the environment variables a provider's key may come from when a run dir names one (api_key_env);
# a provider without a key has none
KEY_ENVS: dict[str, tuple[str, ...]] = {name: (p.key_env,) if p.key_env else () for name, p in PROVIDERS.items()}
KEY_REQUIRED = ("serper", "tavily", "brave", "exa")  # providers that answer nothing without a key
SUMMARIZER_KEY_ENVS = ("OPENAI_API_KEY", "ARPO_API_KEY")  # an OpenAI-compatible endpoint; arpo serve agent's key
# tools.web keys that say where requests and keys go or which addresses browse may fetch: taken from
# a run dir only with --trust-run-config (commands/from_run.py)
RUN_TRUST_KEYS = ("url", "api_key_env", "summarizer_url", "summarizer_key_env", "allow_private", "allow_hosts")


def require_web_keys(enabled, cfg: WebConfig, where: str = "tools.web") -> None:
    """Before anything loads (train, eval, chat, serve agent, web sft-data): when `enabled` has
    web_search and its provider needs a key, the key's environment variable must be set (a run with
    serper and no key trained on, every search an error). ArpoError naming the variable."""
    if "web_search" not in enabled:
        return
    if cfg.provider in KEY_REQUIRED and not os.environ.get(cfg.key_env or ""):
        raise ArpoError(f"{where}.provider {cfg.provider} needs an API key: set the environment variable "
                        f"{cfg.key_env} (or use --web-provider local with `arpo web serve`, or ddgs: no key)")


def check_run_key_envs(web: dict, where: str = "tools.web") -> None:
    """A run dir's tools.web may name only its provider's own key variable (KEY_ENVS) and the
    summarizer's (SUMMARIZER_KEY_ENVS): ArpoError otherwise, naming the key and the allowed names."""
    provider = web.get("provider", WebConfig.provider)
    env = web.get("api_key_env")
    allowed = KEY_ENVS.get(provider, ())
    if env is not None and env not in allowed:
        raise ArpoError(f"{where}.api_key_env: {env!r} is not a key variable of provider {provider} (a run may name "
                        f"{', '.join(allowed) or 'none: the provider takes no key'}); a run dir must not choose which "
                        "secret is sent. Name the variable in your own --tools-config if you mean it")
    env = web.get("summarizer_key_env")
    if env is not None and env not in SUMMARIZER_KEY_ENVS:
        raise ArpoError(f"{where}.summarizer_key_env: {env!r} is not a summarizer key variable (a run may name "
                        f"{', '.join(SUMMARIZER_KEY_ENVS)}); a run dir must not choose which secret is sent. Name "
                        "the variable in your own --tools-config if you mean it")


@dataclass
class WebConfig:
    provider: str = "local"  # ddgs | serper | tavily | brave | exa | searxng | local (arpo web serve)
    url: str | None = None  # provider base URL (None: the provider's default; local: http://127.0.0.1:8090)
    api_key_env: str | None = None  # environment variable holding the key (None: the provider's usual name)
    top_k: int = 5  # results per search
    snippet_chars: int = 300  # characters per result snippet
    timeout_s: float = 10.0  # per HTTP request
    retries: int = 2  # extra attempts after a 429, a 5xx, a timeout or a refused connection
    backoff_s: float = 0.5  # first retry waits this long, then doubles (a Retry-After header wins, up to 30 s)
    rate_limit: float | None = None  # requests per second to the provider (None: its default; 0: no limit)
    # browse
    window_chars: int = 2000  # characters per page window ("page k of n")
    max_bytes: int = 2_000_000  # stop reading a response after this many bytes
    max_redirects: int = 5  # redirects browse follows (each target checked again) before it gives up
    browse_timeout_s: float = 15.0  # the whole fetch, redirects and body included
    allow_private: bool = False  # fetch private / loopback / link-local addresses (the local web is always allowed)
    allow_hosts: list[str] = field(default_factory=list)  # host or host:port allowed even when private
    # provider local: browse may fetch the local web's own host:port (false for a run dir's settings
    # loaded without --trust-run-config, commands/from_run.py: whatever listens there is not the run's to read)
    browse_local_web: bool = True
    # the paper's browser: summarize long pages with a model behind an OpenAI-compatible endpoint
    summarizer_url: str | None = None  # base URL with /v1, e.g. http://127.0.0.1:8000/v1 (arpo serve agent)
    summarizer_model: str | None = None  # model name sent to the endpoint
    summarizer_key_env: str = "OPENAI_API_KEY"  # the key, if the endpoint needs one
    summarize_min_chars: int = 3000  # summarize pages longer than this (shorter ones are shown as they are)
    summarizer_max_tokens: int = 400  # the summary's length cap (max_tokens sent to the endpoint)
    summarizer_input_chars: int = 12000  # page text sent to the summarizer

    def validate(self, key: str = "tools.web") -> WebConfig:
        require(self.provider in PROVIDERS, f"{key}.provider",
                f"{self.provider!r}; choose one of {', '.join(PROVIDERS)}")
        for k in ("top_k", "snippet_chars", "window_chars", "max_bytes"):
            require(getattr(self, k) >= 1, f"{key}.{k}", f"must be >= 1, got {getattr(self, k)}")
        for k in ("timeout_s", "browse_timeout_s"):
            require(getattr(self, k) > 0, f"{key}.{k}", f"must be > 0, got {getattr(self, k)}")
        for k in ("retries", "max_redirects"):
            require(getattr(self, k) >= 0, f"{key}.{k}", f"must be >= 0, got {getattr(self, k)}")
        require(self.backoff_s >= 0, f"{key}.backoff_s", f"must be >= 0, got {self.backoff_s}")
        require(self.rate_limit is None or self.rate_limit >= 0, f"{key}.rate_limit",
                f"must be >= 0 requests per second (0: no limit), got {self.rate_limit}")
        require(self.url is None or self.url.startswith(("http://", "https://")), f"{key}.url",
                f"{self.url!r}; must start with http:// or https://")
        require(self.summarizer_url is None or self.summarizer_url.startswith(("http://", "https://")),
                f"{key}.summarizer_url", f"{self.summarizer_url!r}; must start with http:// or https://")
        require(not (self.summarizer_url and not self.summarizer_model), f"{key}.summarizer_model",
                "set the model name the summarizer endpoint serves (summarizer_url is set)")
        require(isinstance(self.allow_hosts, list), f"{key}.allow_hosts", "must be a list of host or host:port")
        return self

    @property
    def base_url(self) -> str:
        return (self.url or PROVIDERS[self.provider].url).rstrip("/")

    @property
    def key_env(self) -> str | None:
        return self.api_key_env or PROVIDERS[self.provider].key_env

    @property
    def requests_per_s(self) -> float:
        return PROVIDERS[self.provider].rate if self.rate_limit is None else self.rate_limit


def web_config(value: dict | None = None, key: str = "tools.web") -> WebConfig:
    """A WebConfig from a dict of its keys (a library caller's; a config file's `tools.web` is parsed with
    the rest of its config): unknown keys and wrong types are errors naming `key`.<name>."""
    return from_dict(WebConfig, dict(value or {}), prefix=f"{key}.")
