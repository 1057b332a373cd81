"""Config sections shared by the recipes (rollout, train, eval), each documented once."""

from __future__ import annotations

from dataclasses import dataclass, field

from arpo.errors import ArpoError
from arpo.models import DEFAULT_MODEL


@dataclass
class ModelConfig:
    name: str = DEFAULT_MODEL  # HF causal-LM directory or built-in name
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (fp32 on CPU, bf16 on GPU) | float32 | bfloat16 | float16


@dataclass
class ToolsConfig:
    enabled: list[str] = field(default_factory=lambda: ["python"])  # python, search
    python_timeout_s: float = 5.0
    max_output_chars: int = 2000  # python output cut to this many characters (marked)
    search_index: str | None = None  # local index dir (default: $ARPO_CACHE_DIR/indexes/hotpotqa)
    search_url: str | None = None  # or a retrieval server (arpo serve retriever)
    top_k: int = 10  # passages per search (reference 10)
    max_chars: int = 1000  # characters per passage (reference 1000)

    def validate(self) -> None:
        from arpo.tools import KNOWN_TOOLS

        for t in self.enabled:
            if t not in KNOWN_TOOLS:
                raise ArpoError(f"tools.enabled: unknown tool {t!r}; available: {', '.join(KNOWN_TOOLS)}")

    def build(self):
        from arpo.tools import build_tools

        return build_tools(self.enabled, python_timeout_s=self.python_timeout_s, max_output_chars=self.max_output_chars,
                           search_index=self.search_index, search_url=self.search_url, top_k=self.top_k,
                           max_chars=self.max_chars)


@dataclass
class DataConfig:
    path: str = "../shared/data/gsm8k/train.jsonl"  # JSONL/parquet: GSM8K, HotpotQA or {question, answer(s), task}
    limit: int | None = None  # use only the first N examples
    task: str | None = None  # force math | qa (default: per row)
    template: str | None = None  # prompt template (default: from the enabled tools)
