"""`engine_options`: the rollout engine's keywords (`arpo train`'s `engine: hf | vllm | vllm_server`),
each documented once with the engines that read it (READ_BY). A key the chosen engine does not read is
an error naming it; vLLM's own `vllm.LLM` keywords that arpo does not name go, as they are, in `extra`.

    engine: vllm
    engine_options: {max_model_len: 8192, gpu_memory_utilization: 0.5, enable_sleep_mode: true,
                     extra: {swap_space: 4}}

The engines take only the keys set here (`kwargs`); the defaults below are theirs
(tests/engine/test_engine_options.py checks them against the engines' signatures).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from arpo.engine.names import ENGINES, PAUSE_MODES, TRANSFERS
from arpo.errors import require

ALL = ENGINES


@dataclass
class EngineOptions:
    # the entropy estimate's k: the log-probs recorded per token (hf: 0 = off; vllm / vllm_server: >= 1, the
    # servers' --max-logprobs at least k)
    topk_entropy: int = 10
    eos_token_ids: list[int] | None = None  # token ids that end a sequence (None: the tokenizer's and the model's)
    # hf (transformers, the policy module itself)
    max_prefill_tokens: int = 4096  # hf: prompt tokens prefilled in one forward
    share_prompts: bool = True  # hf: identical joining prompts share one prefill
    static: bool = True  # hf: arpo's own forward (engine/static.py) where the architecture is known
    compile: bool = False  # hf: torch.compile the static forward (docs/architecture.md)
    graph: bool = False  # hf on a GPU: CUDA-graph each decode step (fixed-size KV cache)
    # vllm (vllm.LLM in this process, arpo[vllm])
    dtype: str | None = None  # vllm: the weights' dtype (None: the policy's)
    max_model_len: int | None = None  # vllm: context length (None: the model's)
    gpu_memory_utilization: float | None = None  # vllm on a GPU: its share for weights + KV cache (None: vLLM's 0.9)
    kv_cache_gib: float | None = None  # vllm on CPU: the KV cache's GiB (VLLM_CPU_KVCACHE_SPACE; None: vLLM's 4)
    enable_sleep_mode: bool = False  # vllm on a GPU: free its memory while the policy trains
    enable_prefix_caching: bool = True  # vllm: reuse the KV of shared prefixes (the tree's branches)
    enforce_eager: bool | None = None  # vllm: no CUDA graphs (None: on CPU only)
    block_size: int | None = None  # vllm: KV-cache block size in tokens (None: vLLM's)
    multiprocessing: bool = False  # vllm: its engine core in a separate process (V1 multiprocessing)
    seed: int = 0  # vllm: the seed vLLM starts with (arpo seeds each sequence itself)
    # vllm: any other vllm.LLM keyword, passed as it is (e.g. {swap_space: 4, tensor_parallel_size: 2})
    extra: dict[str, Any] = field(default_factory=dict)
    # vllm_server (stock `vllm serve` endpoints at rollout.servers; docs/vllm_backend.md)
    model: str | None = None  # vllm_server: the served model name (None: the first one /v1/models lists)
    timeout_s: float = 600.0  # vllm_server: per request
    connect_timeout_s: float = 10.0  # vllm_server: per connection attempt
    max_retries: int = 2  # vllm_server: extra attempts of a failed request
    weights_dir: str | None = None  # vllm_server, transfer disk: a directory every server reads (None: a temporary one)
    transfer: str = "disk"  # vllm_server: how the policy's weights reach the servers: disk | nccl | ipc
    nccl_port: int = 29600  # vllm_server, transfer nccl: the rendezvous port
    master_address: str | None = None  # vllm_server, transfer nccl: this host's address the servers reach
    push_timeout_s: float = 600.0  # vllm_server: a weight push's deadline (pause, send, resume)
    pause_mode: str = "wait"  # vllm_server: /pause mode while weights change: wait | abort | keep
    packed: bool = True  # vllm_server: send a push's tensors packed in a few buffers

    def validate(self, key: str = "engine_options") -> None:
        require(self.topk_entropy >= 0, f"{key}.topk_entropy", f"must be >= 0, got {self.topk_entropy}")
        for name in ("max_prefill_tokens", "max_model_len", "block_size"):
            v = getattr(self, name)
            require(v is None or v >= 1, f"{key}.{name}", f"must be >= 1, got {v}")
        for name in ("timeout_s", "connect_timeout_s", "push_timeout_s"):
            require(getattr(self, name) > 0, f"{key}.{name}", f"must be > 0, got {getattr(self, name)}")
        require(self.max_retries >= 0, f"{key}.max_retries", f"must be >= 0, got {self.max_retries}")
        u = self.gpu_memory_utilization
        require(u is None or 0 < u <= 1, f"{key}.gpu_memory_utilization", f"must be in (0, 1], got {u}")
        require(self.kv_cache_gib is None or self.kv_cache_gib > 0, f"{key}.kv_cache_gib",
                f"must be > 0, got {self.kv_cache_gib}")
        require(self.dtype in (None, "auto", "float32", "bfloat16", "float16"), f"{key}.dtype",
                f"{self.dtype!r}; choose auto, float32, bfloat16 or float16 (or null: the policy's)")
        require(self.transfer in TRANSFERS, f"{key}.transfer",
                f"{self.transfer!r}; choose one of {', '.join(TRANSFERS)}")
        require(self.pause_mode in PAUSE_MODES, f"{key}.pause_mode",
                f"{self.pause_mode!r}; choose one of {', '.join(PAUSE_MODES)}")
        named = sorted(set(self.extra) & ({f.name for f in dataclasses.fields(self)} | {"servers"}))
        require(not named, f"{key}.extra", f"{', '.join(named)}: set {key}.<name> (servers: rollout.servers), "
                "not in extra")

    def set_keys(self) -> dict[str, Any]:
        """{key: value} of the keys whose value is not the default (extra's keys included)."""
        default = EngineOptions()
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "extra" and getattr(self, f.name) != getattr(default, f.name)}
        return {**out, **self.extra}

    def check(self, engine: str, key: str = "engine_options") -> None:
        """Every key set is read by `engine` (an hf run given max_model_len failed only when the engine
        was built, after the model had loaded)."""
        for name in self.set_keys():
            readers = READ_BY.get(name, ("vllm",))
            require(engine in readers, f"{key}.{name}" if name in READ_BY else f"{key}.extra.{name}",
                    f"engine {engine} does not read it (read by: {', '.join(readers)})")
        require(engine == "hf" or self.topk_entropy >= 1, f"{key}.topk_entropy",
                f"must be >= 1 for engine {engine} (its log-probs are the only source of the entropy)")

    def kwargs(self, engine: str) -> dict[str, Any]:
        """The keywords engine.make_engine passes to `engine`: the keys set (the engine's own defaults
        otherwise), extra's spread for vllm."""
        self.check(engine)
        return self.set_keys()


# the engines that read each key (extra's keys: vllm)
READ_BY: dict[str, tuple[str, ...]] = {
    "topk_entropy": ALL, "eos_token_ids": ALL,
    **dict.fromkeys(("max_prefill_tokens", "share_prompts", "static", "compile", "graph"), ("hf",)),
    **dict.fromkeys(("dtype", "max_model_len", "gpu_memory_utilization", "kv_cache_gib", "enable_sleep_mode",
                     "enable_prefix_caching", "enforce_eager", "block_size", "multiprocessing", "seed"), ("vllm",)),
    **dict.fromkeys(("model", "timeout_s", "connect_timeout_s", "max_retries", "weights_dir", "transfer", "nccl_port",
                     "master_address", "push_timeout_s", "pause_mode", "packed"), ("vllm_server",)),
}
