"""The LLM judge's settings (`arpo eval --judge-*`; the judge: eval/judge.py): its endpoint and model,
retries, concurrency and sampling."""

from __future__ import annotations

from dataclasses import dataclass

from arpo.errors import ArpoError


@dataclass
class JudgeConfig:
    base_url: str  # the OpenAI-compatible API root, e.g. http://localhost:8001/v1
    model: str  # the judge model's name at that endpoint
    api_key_env: str = "OPENAI_API_KEY"  # the environment variable holding the key (unset: "EMPTY", as theirs)
    timeout_s: float = 120.0  # per request
    retries: int = 3  # attempts per judgment (theirs: retry_limit 3)
    backoff_s: float = 1.0  # wait backoff_s * attempt between attempts (theirs: 1 s * attempt)
    workers: int = 8  # judgments in flight at once
    temperature: float | None = 0.0  # None: the server's default (theirs sent none)
    max_tokens: int | None = None  # None: the server's default (theirs sent none)
    seed: int | None = None  # sent only when set (OpenAI's `seed`)

    def validate(self) -> None:
        if not self.base_url or not self.base_url.startswith(("http://", "https://")):
            raise ArpoError(f"--judge-url: {self.base_url!r} is not an http(s) URL of an OpenAI-compatible API "
                            "(e.g. http://127.0.0.1:8001/v1)")
        if not self.model:
            raise ArpoError("--judge-model: name the judge model (the `model` its endpoint serves)")
        if self.retries < 1 or self.workers < 1 or self.timeout_s <= 0:
            raise ArpoError("--judge-retries and --judge-workers must be >= 1 and --judge-timeout > 0")
