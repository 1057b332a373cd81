"""How much memory one GPU needs for a training config: one pure function per term, the math in
its docstring, summed by `estimate` (docs/scaling.md, "Memory per GPU").

A step has two phases that never overlap on a rank: generation (the engine's KV cache, vLLM's own
weights) and training (gradients, activations of one micro-batch, the output head's backward).
What stays resident through both: the policy's weights (its shard under FSDP/HSDP), AdamW's two
moments, the full generation replica (FSDP/HSDP) and π_ref (KL). So

    peak = resident + max(generation, training)

Bytes per element b: 2 for bfloat16/float16, 4 for float32, 8 for float64 (model.dtype; "auto" is
bf16 on a GPU). The activation terms are what the transformers decoder layer (Llama / Qwen2 /
Qwen3: RMSNorm, SDPA attention over arpo's packed tree mask, SwiGLU MLP) saves for backward,
counted tensor by tensor with torch's saved-tensor hooks and checked against a process's peak
memory on CPU (tests/training/test_memory.py, within 15 %).

Korthikanti et al. (2022) give 34·h bytes per token per layer for a GPT layer in 16 bits (4h GeLU
MLP, dropout, flash attention). A SwiGLU layer with intermediate size i keeps 4 tensors of size i
(gate, up, silu(gate), their product) instead of GeLU's 2 of size 4h, and arpo's tree mask adds
S·b per token: for Qwen2.5-7B (h=3584, i=18944) in bf16 this module counts 24h + 8i = 237,568
bytes per token per layer (1.95 × 34h) plus the mask.

Units are GiB (2^30 bytes) against the device's real total (torch.cuda.mem_get_info, or
memory.gpu_memory_gib): an "80 GB" H100 has 81,559 MiB = 79.6 GiB, and vLLM's
gpu_memory_utilization is a share of that total. With a 16-bit model.dtype the policy keeps float32
master weights, gradients and AdamW moments (training/optim.master_compute: 16 bytes per trainable
parameter, sharded under FSDP) and computes in the 16-bit dtype. Under FSDP2 the root's parameters
(embeddings, head, final norm) stay unsharded in the compute dtype from the forward to the backward
(reshard_after_forward=False), and each layer's all-gather (the current and the prefetched one) and
its unsharded gradients live while it computes. memory.cpu_offload (FSDP2's CPUOffloadPolicy) moves
the float32 shards, their gradients and AdamW's moments to host memory. CUDA's context and cuBLAS
workspaces (CUDA_CONTEXT_GIB) and NCCL's buffers under torchrun (NCCL_GIB) are fixed allowances:
benchmarks/gpu_check.py measures the real peak against this estimate.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from arpo.errors import ArpoError
from arpo.models import cache_dir, resolve_model_dir

GIB = 2**30
PROMPT_TOKENS = 512  # the system prompt + question of the shipped templates (a few hundred tokens)
VLLM_GPU_UTILIZATION = 0.9  # vllm.LLM's default gpu_memory_utilization
VLLM_CPU_KV_GIB = 4.0  # vLLM's default VLLM_CPU_KVCACHE_SPACE
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
CUDA_CONTEXT_GIB = 1.0  # CUDA context, cuBLAS/cuDNN workspaces, allocator slack outside torch's tensors (per process)
NCCL_GIB = 1.0  # NCCL communicator buffers under torchrun (per rank)
VLLM_CONTEXT_GIB = 1.5  # an in-process vLLM's CUDA graphs and context, kept while it sleeps


@dataclass(frozen=True)
class Arch:
    """The shape of a decoder-only transformer (the fields of its config.json)."""

    layers: int
    hidden: int  # h
    intermediate: int  # i (SwiGLU)
    heads: int
    kv_heads: int
    head_dim: int  # d
    vocab: int  # V
    tied: bool  # the output head is the embedding matrix
    qkv_bias: bool = False  # Qwen2: biases on q, k, v

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim


# The shipped GPU recipes' models (their config.json), for machines where the weights are not present
KNOWN_ARCHS = {
    "qwen2.5-1.5b": Arch(28, 1536, 8960, 12, 2, 128, 151936, tied=True, qkv_bias=True),
    "qwen2.5-7b": Arch(28, 3584, 18944, 28, 4, 128, 152064, tied=False, qkv_bias=True),
    "qwen3-8b": Arch(36, 4096, 12288, 32, 8, 128, 151936, tied=False),
    "qwen3-14b": Arch(40, 5120, 17408, 40, 8, 128, 151936, tied=False),
}


def arch_from_config(c) -> Arch:
    """An Arch from a transformers config (or anything with its attribute names)."""
    heads = c.num_attention_heads
    return Arch(layers=c.num_hidden_layers, hidden=c.hidden_size, intermediate=c.intermediate_size, heads=heads,
                kv_heads=getattr(c, "num_key_value_heads", None) or heads,
                head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads, vocab=c.vocab_size,
                tied=bool(getattr(c, "tie_word_embeddings", False)),
                qkv_bias=bool(getattr(c, "attention_bias", False)) or c.model_type == "qwen2")


def find_arch(model_name: str) -> Arch | None:
    """The architecture of model.name: its config.json when the model is on this machine (a model
    directory, a run or checkpoint directory, a LoRA adapter's base, a built-in model already
    converted), else the shipped recipes' models by name (KNOWN_ARCHS, matched case-insensitively
    in the name), else None. Never converts or loads weights."""
    found = _local_config(model_name)
    if found is not None:
        from transformers import AutoConfig

        return arch_from_config(AutoConfig.from_pretrained(str(found.parent)))
    low = model_name.lower()
    for key, arch in KNOWN_ARCHS.items():
        if key in low:
            return arch
    return None


def _local_config(name: str, depth: int = 0):
    """The config.json of model `name` if it is on this machine (see find_arch), else None."""
    p = Path(name).expanduser()
    if not p.is_dir():  # a built-in name: only when converted already (resolve_model_dir would convert it)
        c = cache_dir() / "models" / name / "config.json"
        return c if c.is_file() else None
    try:
        p = resolve_model_dir(str(p))
    except ArpoError:
        return None
    if (p / "config.json").is_file():
        return p / "config.json"
    adapter = p / "adapter_config.json"
    if adapter.is_file() and depth < 2:  # a LoRA adapter: its base model's shape
        base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        return _local_config(str(base), depth + 1) if base else None
    return None


# ---- the terms ----------------------------------------------------------------------------------
def n_params(a: Arch) -> int:
    """Parameters: embeddings V·h (twice when the head is untied), per layer the attention
    h·q + 2·h·kv·d + q·h (q = heads·d; plus q + 2·kv·d biases on Qwen2), the MLP 3·h·i and two
    norms 2h, and the final norm h."""
    kv = a.kv_heads * a.head_dim
    attn = a.hidden * a.q_dim + 2 * a.hidden * kv + a.q_dim * a.hidden + ((a.q_dim + 2 * kv) if a.qkv_bias else 0)
    layer = attn + 3 * a.hidden * a.intermediate + 2 * a.hidden
    return a.vocab * a.hidden * (1 if a.tied else 2) + a.layers * layer + a.hidden


def weights_bytes(n: int, b: int, shards: int = 1) -> float:
    """Weights of n parameters in b bytes each, split over `shards` ranks (FSDP/HSDP shard group;
    1 unsharded): n·b / shards."""
    return n * b / shards


def adamw_bytes(n_trainable: int, b: int, shards: int = 1) -> float:
    """AdamW's first and second moments, kept in the parameters' dtype by torch.optim.AdamW:
    2·n·b / shards."""
    return 2 * n_trainable * b / shards


def layer_params(a: Arch) -> int:
    """Parameters of one decoder layer (n_params without embeddings, head and final norm, over L)."""
    return (n_params(a) - a.vocab * a.hidden * (1 if a.tied else 2) - a.hidden) // a.layers


def fsdp_root_bytes(a: Arch, b: int) -> float:
    """FSDP2's root group (embeddings, head, final norm) all-gathered in the compute dtype and kept
    from the forward to the backward (reshard_after_forward=False, training/distributed.py), plus its
    unsharded gradients before the reduce-scatter: 2 · (V·h·(1 or 2 untied) + h) · b."""
    return 2 * (a.vocab * a.hidden * (1 if a.tied else 2) + a.hidden) * b


def fsdp_buffer_bytes(a: Arch, b: int, master: int) -> float:
    """FSDP2's per-layer buffers while a layer computes: its all-gathered parameters and the next
    layer's (prefetch), in the compute dtype, and its unsharded gradients (b) with their copy in the
    reduce dtype (`master` bytes when it differs from b): 2·P·b + P·(b + master·[master ≠ b])."""
    p = layer_params(a)
    return 2 * p * b + p * (b + (master if master != b else 0))


def kv_cache_bytes(a: Arch, sequences: int, tokens: int, b: int) -> float:
    """K and V of every layer for `sequences` sequences of `tokens` tokens:
    2 · layers · kv_heads · d · b per token."""
    return 2 * a.layers * a.kv_heads * a.head_dim * b * sequences * tokens


def norm_bytes_per_token(h: int, b: int) -> float:
    """One RMSNorm's saved tensors per token: its input upcast to float32 (4h), 1/rms (4), and the
    normalized values before and after the weight in the model dtype (2·b·h): 4h + 4 + 2bh."""
    return 4 * h + 4 + 2 * b * h


def layer_bytes_per_token(a: Arch, b: int) -> float:
    """What one decoder layer saves for backward, per token, without the mask: two norms, SDPA's
    q, k, v (k and v repeated to all heads) and output (4·b·heads·d) and log-sum-exp (4·heads), the
    SwiGLU's gate, up, silu(gate) and product (4·b·i):
    2·(4h + 4 + 2bh) + 4·b·heads·d + 4·heads + 4·b·i.
    bf16 with heads·d = h: 24h + 8i + 4·heads + 8 (GPT's 34h: see the module docstring)."""
    return 2 * norm_bytes_per_token(a.hidden, b) + 4 * b * a.q_dim + 4 * a.heads + 4 * b * a.intermediate


def mask_bytes_per_token(seq: int, b: int) -> float:
    """arpo's packed tree mask (training/packing.py) is a boolean (S, S); SDPA turns it into an
    additive mask in the activation dtype and saves it in every layer: S·b per token per layer."""
    return seq * b


def activation_bytes(a: Arch, tokens: int, seq: int, b: int, checkpointing: bool) -> float:
    """Saved activations of one micro-batch of `tokens` tokens in packs of up to `seq` tokens.
    Without checkpointing every layer keeps its tensors: L · T · (layer + mask).
    With it (non-reentrant, per decoder layer) each layer keeps only its input, T·h·b, and the
    backward recomputes one layer at a time: L·T·h·b + T·(layer + mask)."""
    one_layer = tokens * (layer_bytes_per_token(a, b) + mask_bytes_per_token(seq, b))
    if checkpointing:
        return a.layers * tokens * a.hidden * b + one_layer
    return a.layers * one_layer


def head_bytes(a: Arch, tokens: int, b: int, chunk: int = 1024) -> float:
    """The output head's part of a micro-batch (algos/logprobs.py, chunked): the final norm and the
    gathered hidden states per token (4h + 4 + 3bh), float32 logits and their gradient for one chunk
    (2 · 4 · chunk · V), and the backward's float32 weight gradient V·h·4 (plus a float32 copy of
    the weight, 4·V·h, when the model is not float32)."""
    weight = 4 * a.vocab * a.hidden * (1 if b == 4 else 2)
    return tokens * (norm_bytes_per_token(a.hidden, b) + b * a.hidden) + 2 * 4 * chunk * a.vocab + weight


def micro_seq(tokens: int, prompt: int, group_size: int, response: int, packed: bool) -> int:
    """The longest pack S of a micro-batch: a whole tree (prompt + M responses) when packed, one
    trajectory (prompt + response) when not, never more than the micro-batch's tokens."""
    return min(tokens, prompt + (group_size if packed else 1) * response)


# ---- the estimate ---------------------------------------------------------------------------------
@dataclass
class Estimate:
    """Bytes per GPU, by term; `peak` = resident + max(generation, training). `host`: bytes the config
    keeps in host memory instead (memory.cpu_offload), by term."""

    terms: dict[str, float]
    resident: tuple[str, ...] = ("weights", "optimizer", "replica", "reference", "overhead")
    generation: tuple[str, ...] = ("engine_weights", "kv_cache")  # vLLM without sleep mode: resident
    training: tuple[str, ...] = ("gradients", "fsdp_root", "fsdp_buffers", "activations", "head")
    host: dict[str, float] = field(default_factory=dict)

    def phase(self, names) -> float:
        return sum(self.terms.get(n, 0.0) for n in names)

    @property
    def peak(self) -> float:
        return self.phase(self.resident) + max(self.phase(self.generation), self.phase(self.training))

    def margin(self, gpu_gib: float) -> float:
        """GiB left on a GPU of gpu_gib at the peak (negative: it does not fit)."""
        return gpu_gib - self.peak / GIB

    def lines(self, gpu_gib: float | None) -> list[str]:
        out = [f"{k:>15}: {v / GIB:8.2f} GiB" for k, v in self.terms.items()]
        out += [f"{k:>15}: {v / GIB:8.2f} GiB in host memory (memory.cpu_offload)" for k, v in self.host.items()]
        res, gen, train = (self.phase(p) / GIB for p in (self.resident, self.generation, self.training))
        out.append(f"{'peak':>15}: {self.peak / GIB:8.2f} GiB = resident {res:.2f} + max(generation {gen:.2f}, "
                   f"training {train:.2f})")
        if gpu_gib:
            m = self.margin(gpu_gib)
            out.append(f"{'gpu':>15}: {gpu_gib:8.2f} GiB -> "
                       + (f"fits, margin {m:.2f} GiB" if m >= 0 else f"DOES NOT FIT (short by {-m:.2f} GiB)"))
        return out


def dtype_bytes(dtype: str, on_gpu: bool) -> int:
    """model.dtype in bytes; auto: bf16 on a GPU, fp32 on CPU."""
    if dtype == "auto":
        return 2 if on_gpu else 4
    return DTYPE_BYTES[dtype]


def estimate(cfg, a: Arch, ranks: int, on_gpu: bool = True, shard_group: int | None = None,
             gpu_gib: float | None = None) -> Estimate:
    """The per-GPU memory of TrainConfig `cfg` on `ranks` ranks (shard_group: the FSDP/HSDP shard
    group's size, default all ranks; 1 under ddp or in one process). b: the compute dtype's bytes;
    m: the trained weights' bytes (4 over a 16-bit b: float32 master weights, optim.master_compute;
    LoRA's adapter weights are float32 too, its frozen base stays in b). The engine's KV cache: the
    hf engine holds every live sequence of the rank's trees, ceil(prompts_per_step / ranks) · M of
    PROMPT_TOKENS + max_response_tokens each (the worst case: every trajectory at its budget); vLLM
    on a GPU takes engine_options.gpu_memory_utilization (vLLM's default 0.9) of the GPU's total
    gpu_gib for its weights and cache together (it queues sequences that do not fit), on CPU
    kv_cache_gib (vLLM's default 4 GiB) for the cache."""
    b = dtype_bytes(cfg.model.dtype, on_gpu)
    mixed = b == 2  # a 16-bit compute dtype: float32 master weights and optimizer state
    n = n_params(a)
    sharded = ranks > 1 and cfg.run.distributed in ("fsdp", "hsdp")
    shards = (shard_group or ranks) if sharded else 1
    lora = cfg.lora.enabled
    n_train = lora_params(cfg, a) if lora else n
    m = 4 if mixed else b
    offload = sharded and cfg.memory.cpu_offload
    state = {"weights": weights_bytes(n, b, shards) + weights_bytes(n_train, m, shards) if lora
             else weights_bytes(n, m, shards),
             "optimizer": adamw_bytes(n_train, m, shards), "gradients": weights_bytes(n_train, m, shards)}
    host = {k: state.pop(k) for k in list(state)} if offload else {}
    # a 16-bit generation copy: the FSDP replica (hf/vllm engines), or over float32 masters in one process
    copy = cfg.engine != "vllm_server" and (sharded or (mixed and not lora))
    t: dict[str, float] = {"weights": state.get("weights", 0.0), "optimizer": state.get("optimizer", 0.0),
                           "replica": weights_bytes(n, b) if copy else 0.0}
    if cfg.algo.kl_coef:
        t["reference"] = weights_bytes(n, b)
    t["overhead"] = ((CUDA_CONTEXT_GIB + (NCCL_GIB if ranks > 1 else 0.0)
                      + (VLLM_CONTEXT_GIB if cfg.engine == "vllm" else 0.0)) * GIB if on_gpu else 0.0)
    seqs = math.ceil(cfg.prompts_per_step / ranks) * cfg.rollout.group_size
    length = PROMPT_TOKENS + cfg.agent.max_response_tokens
    phases: dict = {}
    opts = cfg.engine_options
    if cfg.engine == "vllm":
        t["engine_weights"] = weights_bytes(n, b)
        if on_gpu and gpu_gib:  # vLLM takes gpu_memory_utilization of the GPU's total for weights + cache
            util = VLLM_GPU_UTILIZATION if opts.gpu_memory_utilization is None else opts.gpu_memory_utilization
            t["kv_cache"] = max(util * gpu_gib * GIB - t["engine_weights"], 0.0)
        elif not on_gpu:  # CPU: VLLM_CPU_KVCACHE_SPACE
            t["kv_cache"] = (VLLM_CPU_KV_GIB if opts.kv_cache_gib is None else opts.kv_cache_gib) * GIB
        else:
            t["kv_cache"] = kv_cache_bytes(a, seqs, length, b)
        if not (opts.enable_sleep_mode and on_gpu):  # vLLM keeps its memory while the policy trains
            phases = {"resident": ("weights", "optimizer", "replica", "reference", "overhead", "engine_weights",
                                   "kv_cache"), "generation": ()}
    else:  # hf (and engines that decode elsewhere hold no cache here: vllm_server)
        t["kv_cache"] = kv_cache_bytes(a, seqs, length, b) if cfg.engine == "hf" else 0.0
    t["gradients"] = state.get("gradients", 0.0)
    if sharded:
        t["fsdp_root"] = fsdp_root_bytes(a, b)
        t["fsdp_buffers"] = fsdp_buffer_bytes(a, b, m)
    tokens = cfg.micro_tokens
    seq = micro_seq(tokens, PROMPT_TOKENS, cfg.rollout.group_size, cfg.agent.max_response_tokens, cfg.packed)
    t["activations"] = activation_bytes(a, tokens, seq, b, cfg.memory.activation_checkpointing)
    t["head"] = head_bytes(a, tokens, b)
    return Estimate(t, **phases, host=host)


def lora_params(cfg, a: Arch) -> int:
    """LoRA adds r·(in + out) parameters per targeted linear of every layer (q, k, v, o, gate, up,
    down by default)."""
    kv = a.kv_heads * a.head_dim
    shapes = {"q_proj": (a.hidden, a.q_dim), "k_proj": (a.hidden, kv), "v_proj": (a.hidden, kv),
              "o_proj": (a.q_dim, a.hidden), "gate_proj": (a.hidden, a.intermediate),
              "up_proj": (a.hidden, a.intermediate), "down_proj": (a.intermediate, a.hidden)}
    per_layer = sum(cfg.lora.r * sum(shapes[m]) for m in cfg.lora.target_modules if m in shapes)
    return a.layers * per_layer


# ---- a config's estimate: --print-config and the refusal at start ----------------------------------
def planned_ranks(cfg) -> tuple[int, int]:
    """(ranks, shard group) the estimate is for: torchrun's WORLD_SIZE when launched, else
    memory.gpus (0: 1); the shard group is every rank under fsdp, run.hsdp_shard_size under hsdp
    (0: LOCAL_WORLD_SIZE under torchrun, else min(ranks, 8): one 8-GPU node), 1 under ddp."""
    ranks = int(os.environ.get("WORLD_SIZE", 0)) or cfg.memory.gpus or 1
    if cfg.run.distributed == "hsdp":
        group = cfg.run.hsdp_shard_size or int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or min(ranks, 8)
    else:
        group = ranks if cfg.run.distributed == "fsdp" else 1
    return ranks, group


def gpu_budget_gib(cfg) -> float | None:
    """The GPU's memory in GiB: memory.gpu_memory_gib, else memory.gpu_memory_gb (decimal GB, the older
    key) in GiB, else the total of this rank's GPU (torch.cuda.mem_get_info) when the model runs on
    one, else None."""
    if cfg.memory.gpu_memory_gib:
        return cfg.memory.gpu_memory_gib
    if cfg.memory.gpu_memory_gb:
        return cfg.memory.gpu_memory_gb * 1e9 / GIB
    import torch  # noqa: PLC0415 - loads torch; kept out of this light module's import

    if cfg.model.device.startswith("cpu") or not torch.cuda.is_available():
        return None
    return torch.cuda.mem_get_info(torch.cuda.current_device())[1] / GIB


def config_estimate(cfg, ranks: int | None = None) -> tuple[Estimate | None, float | None, str]:
    """(estimate or None when the architecture is unknown, GPU memory in GiB or None, a one-line
    description of what was assumed)."""
    import torch  # noqa: PLC0415 - loads torch; kept out of this light module's import

    a = find_arch(cfg.model.name)
    gpu = gpu_budget_gib(cfg)
    planned, group = planned_ranks(cfg)
    ranks = ranks or planned
    if a is None:
        return None, gpu, f"no estimate: the architecture of {cfg.model.name} is unknown (no config.json here)"
    on_gpu = not cfg.model.device.startswith("cpu") and (gpu is not None or torch.cuda.is_available())
    est = estimate(cfg, a, ranks, on_gpu=on_gpu, shard_group=min(group, ranks), gpu_gib=gpu)
    n = n_params(a)
    size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
    b = dtype_bytes(cfg.model.dtype, on_gpu)
    what = (f"{size} parameters, {ranks} rank(s), run.distributed={cfg.run.distributed}"
            f"{f' (shard group {min(group, ranks)})' if ranks > 1 else ''}, "
            f"{b} bytes per value{' (float32 master weights and AdamW state)' if b == 2 else ''}, "
            f"activation_checkpointing={str(cfg.memory.activation_checkpointing).lower()}, "
            f"cpu_offload={str(cfg.memory.cpu_offload).lower()}")
    return est, gpu, what


def advice(cfg, est: Estimate) -> str:
    """The keys that shrink the largest term of the estimate."""
    t = est.terms
    train, gen = est.phase(est.training), est.phase(est.generation)
    keys = []
    if train >= gen and not cfg.memory.activation_checkpointing:
        keys.append("memory.activation_checkpointing=true")
    if train >= gen:
        keys.append(f"a smaller micro_tokens (now {cfg.micro_tokens})")
    if gen > train or t.get("kv_cache", 0) > t.get("activations", 0):
        keys.append(f"fewer sequences per rank (prompts_per_step={cfg.prompts_per_step} over more GPUs, "
                    f"or agent.max_response_tokens={cfg.agent.max_response_tokens})"
                    + (" or engine_options.kv_cache_gib" if cfg.engine == "vllm" else ""))
    if cfg.run.distributed == "ddp":
        keys.append("run.distributed=fsdp (shards weights, gradients and AdamW)")
    elif not cfg.memory.cpu_offload and t.get("optimizer", 0) > 0:
        keys.append("memory.cpu_offload=true (float32 shards, gradients and AdamW in host memory; torchrun)")
    keys.append("memory.gpu_memory_gib (if your GPU has more)")
    return "; ".join(keys)


def check_fits(cfg, ranks: int) -> None:
    """Refuse (ArpoError naming the keys to change) a config whose estimate exceeds the GPU budget."""
    est, gpu, what = config_estimate(cfg, ranks)
    if est is None or gpu is None or est.peak <= gpu * GIB:
        return
    raise ArpoError(f"memory: this config needs about {est.peak / GIB:.1f} GiB per GPU, more than the "
                    f"{gpu:.1f} GiB it has ({what}):\n  " + "\n  ".join(est.lines(gpu))
                    + f"\nchange: {advice(cfg, est)}  (the estimate: training/memory.py, docs/scaling.md)")


def report(cfg) -> str:
    """The estimate as comment lines (`arpo train --print-config`)."""
    est, gpu, what = config_estimate(cfg)
    if est is None:
        return f"# memory per GPU: {what}"
    return "\n".join([f"# memory per GPU (estimate, training/memory.py; {what}):",
                      *(f"#   {line}" for line in est.lines(gpu))])
