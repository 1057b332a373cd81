"""The RL run's config (`arpo train --config ...`): the shared sections (settings/sections.py,
settings/agent.py, settings/rollout.py) plus the algorithm, validation, memory and run sections and the
step's own knobs. YAML → these dataclasses → dotted overrides (config.py); every field documented once,
on its line."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from arpo.engine import ENGINES
from arpo.errors import ArpoError, require
from arpo.settings.agent import AgentConfig, ToolsConfig
from arpo.settings.engine import EngineOptions
from arpo.settings.rollout import RolloutConfig
from arpo.settings.sections import DataConfig, LoraConfig, ModelConfig, OptimConfig, RewardConfig, RunConfig


@dataclass
class AlgoConfig:
    """An algorithm preset (algos/presets.py) and optional overrides of its loss/advantage fields."""

    preset: str = "arpo"  # arpo | grpo | dapo | reinforce_pp | dr_grpo | gspo | aepo | tree_grpo
    # grpo | dr_grpo | reinforce_pp | reinforce_pp_baseline | tree_grpo | module.path:function (algos/advantages.py)
    advantage_estimator: str | None = None
    attribution: str | None = None  # soft | hard
    loss_type: str | None = None  # ppo_clip | gspo (sequence-level ratio) | entropy_balanced (AEPO)
    loss_agg: str | None = None  # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    clip_low: float | None = None  # ε_low: the ratio's lower clip is 1 - clip_low
    clip_high: float | None = None  # ε_high: upper clip 1 + clip_high (DAPO clip-higher when > clip_low)
    dual_clip: float | None = None  # c: bound of the loss for negative advantages (0 disables)
    kl_coef: float | None = None  # β_KL to the initial model (0: no reference model is kept)
    kl_type: str | None = None  # k1 | k2 | k3 (unclamped; verl's "k3" is low_var_kl) | low_var_kl
    entropy_coef: float | None = None  # entropy bonus coefficient (0: off)
    ppo_epochs: int | None = None  # passes over each step's rollouts
    dynamic_sampling: bool | None = None  # DAPO: drop uniform-reward groups and sample more (any preset)
    dynamic_sampling_max_rounds: int | None = None  # cap on generation rounds per step (preset default 10)

    def resolve(self):
        """The preset with the keys this config sets (an error names the key)."""
        from arpo.algos.presets import get_preset  # noqa: PLC0415 - loads torch; kept out of this light module's import

        p = get_preset(self.preset)
        over = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "preset" and getattr(self, f.name) is not None}
        if over.get("dual_clip") == 0:
            over["dual_clip"] = None
        try:
            return dataclasses.replace(p, **over)
        except ArpoError as e:
            raise ArpoError(f"algo: {e}") from e


@dataclass
class ValidationConfig:
    path: str | None = None  # held-out data spec (e.g. svamp:test, a file); None disables validation
    limit: int = 16  # held-out examples used (the first n)
    every: int = 10  # steps
    samples: int = 1  # answers sampled per held-out example (pass@k-style metrics when > 1)
    temperature: float = 0.0  # 0: greedy

    def validate(self) -> None:
        require(self.limit >= 1, "validation.limit", f"must be >= 1, got {self.limit}")
        require(self.every >= 0, "validation.every", f"must be >= 0 (0: never), got {self.every}")
        require(self.samples >= 1, "validation.samples", f"must be >= 1, got {self.samples}")
        require(self.temperature >= 0, "validation.temperature", f"must be >= 0, got {self.temperature}")


@dataclass
class MemoryConfig:
    """What bounds a step's memory per GPU (the estimate: training/memory.py, docs/scaling.md)."""

    # recompute each decoder layer's activations in the backward instead of keeping them (torch's
    # non-reentrant checkpoint per layer): a micro-batch keeps L·T·h·b bytes plus one layer's instead
    # of every layer's, for about one more forward pass of compute
    activation_checkpointing: bool = False
    # memory of one GPU in GiB (2^30 bytes; an "80 GB" H100 has 79.6); a config whose estimate exceeds
    # it is refused, naming the key to change. 0: the detected GPU's total (no check on CPU)
    gpu_memory_gib: float = 0.0
    gpu_memory_gb: float = 0.0  # the same in decimal GB (1e9 bytes; the older key): use gpu_memory_gib
    # the ranks (GPUs) `--print-config` estimates for when it is not run under torchrun (0: 1);
    # under torchrun the real world size is used
    gpus: int = 0
    # FSDP/HSDP under torchrun: keep the float32 parameter shards, their gradients and AdamW's moments in
    # (pinned) host memory and run the optimizer step on the CPU (FSDP2's CPUOffloadPolicy)
    cpu_offload: bool = False

    def validate(self) -> None:
        require(self.gpu_memory_gib >= 0, "memory.gpu_memory_gib",
                f"must be >= 0 (0: detect), got {self.gpu_memory_gib}")
        require(self.gpu_memory_gb >= 0, "memory.gpu_memory_gb", f"must be >= 0 (0: detect), got {self.gpu_memory_gb}")
        require(not (self.gpu_memory_gib and self.gpu_memory_gb), "memory.gpu_memory_gb",
                "set memory.gpu_memory_gib (GiB) or the older gpu_memory_gb (GB), not both")
        require(self.gpus >= 0, "memory.gpus", f"must be >= 0, got {self.gpus}")


@dataclass
class MonitorConfig:
    """Named warnings when a run collapses (training/health.py: no_signal, all_malformed, format_rising,
    accuracy_collapse, heldout_collapse, fewer_calls, entropy_collapse), and the guard that acts on the
    collapses (docs/training_health.md)."""

    # off: no checks | warn: a named warning on stderr and warn/<name> = 1 in the step's metrics |
    # stop: warn, and stop the run (with a checkpoint) once a collapse (all_malformed, format_rising,
    # accuracy_collapse, heldout_collapse) has held for `patience` consecutive steps
    guard: str = "warn"
    # consecutive steps a collapse must hold before `guard: stop` stops the run (3: the committed studies
    # replayed, docs/training_health.md)
    patience: int = 3

    def validate(self) -> None:
        require(self.guard in ("off", "warn", "stop"), "monitor.guard", f"{self.guard!r}; choose off, warn or stop")
        require(self.patience >= 1, "monitor.patience", f"must be >= 1, got {self.patience}")


@dataclass
class TrainRunConfig(RunConfig):
    # under torchrun: fsdp (sharded over all ranks, FSDP2) | hsdp (FSDP2 on a 2-D mesh: sharded within
    # groups of hsdp_shard_size ranks, replicated across groups, e.g. one group per node) | ddp (a full
    # replica per rank)
    distributed: str = "fsdp"
    hsdp_shard_size: int = 0  # hsdp: ranks per shard group (0: the ranks of one node, LOCAL_WORLD_SIZE)
    save_rollouts: int = 1  # keep the trees in RUN_DIR/rollouts/ every k steps for `arpo view` (0: off)
    rollout_trees: int = 8  # trees kept per saved step (0: all); size: training/rollout_log.py

    def validate(self) -> None:
        super().validate()
        if self.distributed not in ("fsdp", "hsdp", "ddp"):
            raise ArpoError(f"run.distributed: {self.distributed!r}; choose fsdp, hsdp or ddp")
        if self.hsdp_shard_size < 0:
            raise ArpoError(f"run.hsdp_shard_size: must be >= 0 (0: the ranks of one node), got {self.hsdp_shard_size}")
        if self.save_rollouts < 0 or self.rollout_trees < 0:
            raise ArpoError("run.save_rollouts and run.rollout_trees must be >= 0")


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)  # the policy to train
    data: DataConfig = field(default_factory=DataConfig)  # the training prompts (rows: README "Your own data")
    tools: ToolsConfig = field(default_factory=ToolsConfig)  # the tools the agent may call
    agent: AgentConfig = field(default_factory=AgentConfig)  # one trajectory: sampling and tool-call budget
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # the ARPO tree per prompt (spec §2)
    algo: AlgoConfig = field(default_factory=AlgoConfig)  # advantages and loss: a preset, keys set override it
    reward: RewardConfig = field(default_factory=RewardConfig)  # how a finished trajectory is scored
    optim: OptimConfig = field(default_factory=OptimConfig)  # optimizer and learning-rate schedule
    lora: LoraConfig = field(default_factory=LoraConfig)  # train a LoRA adapter instead of all weights
    run: TrainRunConfig = field(default_factory=lambda: TrainRunConfig(dir="runs/train"))  # where and how it is saved
    validation: ValidationConfig = field(default_factory=ValidationConfig)  # held-out evaluation during training
    monitor: MonitorConfig = field(default_factory=MonitorConfig)  # collapse warnings and the guard
    steps: int = 10  # optimizer steps of the run (each: prompts_per_step prompts, rollout, update)
    prompts_per_step: int = 4  # prompts whose trees make one step's batch
    minibatches: int = 1  # optimizer steps per PPO epoch (trees split evenly)
    packed: bool = True  # tree-packed log-probs/backward (False: flat per-trajectory)
    micro_tokens: int = 4096  # model tokens per forward/backward micro-batch
    memory: MemoryConfig = field(default_factory=MemoryConfig)  # activation checkpointing, GPU memory to fit
    # the behaviour policy's log-probs (old_logp): rollout = the values the engine recorded while
    # sampling (saves a forward pass); recompute = a no-grad forward over the batch; auto = rollout
    # where they are exact (hf engine, float32, no top-k/top-p truncation), else recompute
    old_logprobs: str = "auto"
    engine: str = "hf"  # rollout engine: hf (transformers; decodes with the policy itself) | vllm (arpo[vllm]) |
    # vllm_server (stock `vllm serve` endpoints at rollout.servers)
    # the engine's keywords, each read by the engines it names (settings/engine.py), e.g. vllm:
    # {max_model_len: 4096, gpu_memory_utilization: 0.5, enable_sleep_mode: true, extra: {swap_space: 4}}
    engine_options: EngineOptions = field(default_factory=EngineOptions)

    def validate(self) -> None:
        self.optim.validate()
        self.tools.validate()
        self.rollout.validate()
        if self.steps < 1 or self.prompts_per_step < 1:
            raise ArpoError("steps and prompts_per_step must be >= 1")
        if not 1 <= self.minibatches <= self.prompts_per_step:
            raise ArpoError(f"minibatches must be in [1, prompts_per_step={self.prompts_per_step}]")

        require(self.agent.temperature > 0, "agent.temperature",
                f"must be > 0 for training, got {self.agent.temperature}: greedy rollouts give identical samples, "
                "zero advantages and no gradient (spec §2 trains at 1.0)")
        require(self.agent.repetition_penalty == 1.0, "agent.repetition_penalty",
                f"must be 1 for training, got {self.agent.repetition_penalty}: the policy's log-probs are those of "
                "the model's own distribution (use it in arpo chat / eval)")
        require(self.micro_tokens >= 1, "micro_tokens", f"must be >= 1, got {self.micro_tokens}")
        for sec in (self.model, self.data, self.agent, self.lora, self.run, self.validation, self.memory, self.monitor,
                    self.reward):
            sec.validate()
        if self.old_logprobs not in ("auto", "rollout", "recompute"):
            raise ArpoError(f"old_logprobs: {self.old_logprobs!r}; choose auto, rollout or recompute")
        require(self.old_logprobs != "rollout" or (self.agent.top_p >= 1.0 and self.agent.top_k == 0),
                "old_logprobs", "rollout takes π_old from the engine's records, which are not the full softmax "
                "the loss compares with under agent.top_p < 1 or agent.top_k > 0: use auto or recompute")

        if self.engine not in ENGINES:
            raise ArpoError(f"engine: {self.engine!r}; choose one of {', '.join(ENGINES)}")
        require(self.engine != "vllm_server" or bool(self.rollout.servers), "rollout.servers",
                "engine vllm_server needs the URLs of its `vllm serve` endpoints, e.g. [http://127.0.0.1:8000]")
        require(self.engine == "vllm_server" or not self.rollout.servers, "rollout.servers",
                f"only engine vllm_server uses servers (engine is {self.engine!r})")
        self.engine_options.validate()
        self.engine_options.check(self.engine)
        require(self.engine not in ("vllm", "vllm_server") or self.rollout.entropy_estimator == "topk",
                "rollout.entropy_estimator", f"full needs every token's logits, which engine {self.engine} does not "
                "return (vLLM returns engine_options.topk_entropy log-probs a token): set rollout.entropy_estimator="
                "topk (the reference's estimator)")
