"""The sections every command's config shares: the model, the data, the optimizer, LoRA, the run
dir and the reward, each field documented once (on its line)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from arpo.errors import ArpoError, require
from arpo.models import DEFAULT_MODEL, lora_adapter


@dataclass
class ModelConfig:
    name: str = DEFAULT_MODEL  # HF causal-LM directory or built-in name
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (fp32 on CPU, bf16 on GPU) | float32 | bfloat16 | float16 | float64
    # training only (sft, train): train just the top N decoder layers and the final norm, freezing
    # the embeddings (tied to the output head on SmolLM2) and every layer below: the backward pass
    # stops at layer L-N, so a step costs less. 0: train every weight
    train_layers: int = 0

    def validate(self) -> None:
        require(self.dtype in ("auto", "float32", "bfloat16", "float16", "float64"), "model.dtype",
                f"{self.dtype!r}; choose auto, float32, bfloat16, float16 or float64")
        d = self.device
        require(d in ("auto", "cpu", "cuda", "mps") or d.startswith(("cuda:", "cpu:")), "model.device",
                f"{d!r}; choose auto, cpu, cuda or cuda:N")
        require(self.train_layers >= 0, "model.train_layers", f"{self.train_layers}; must be >= 0")


@dataclass
class DataConfig:
    path: str = "gsm8k:train"  # built-in name (`arpo data list`), hf:NAME[:CONFIG]:SPLIT, JSONL(.gz)/parquet file/glob
    limit: int | None = None  # use only the first N examples
    task: str | None = None  # force math | qa (default: per row)
    template: str | None = None  # prompt template (default: from the enabled tools)

    def validate(self) -> None:
        require(self.limit is None or self.limit >= 1, "data.limit", f"must be >= 1 (or null: all), got {self.limit}")
        require(self.task in (None, "math", "qa"), "data.task", f"{self.task!r}; choose math or qa (or null)")


@dataclass
class OptimConfig:
    lr: float = 1e-6  # AdamW peak learning rate (the ARPO reference trains RL at 1e-6, constant)
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW (β1, β2)
    schedule: str = "constant"  # constant | cosine | linear (after warmup)
    warmup_steps: int = 0  # linear warmup from 0 to lr over this many optimizer steps (minibatches × epochs a step)
    min_lr_ratio: float = 0.0  # cosine/linear decay down to lr * this
    grad_clip: float = 1.0  # max global gradient norm (0 disables)

    def validate(self) -> None:
        if self.lr <= 0:
            raise ArpoError(f"optim.lr must be > 0, got {self.lr}")
        if self.schedule not in ("constant", "cosine", "linear"):
            raise ArpoError(f"optim.schedule: {self.schedule!r}; choose constant, cosine or linear")
        if len(self.betas) != 2:
            raise ArpoError(f"optim.betas must have 2 values, got {self.betas}")
        require(all(0 <= b < 1 for b in self.betas), "optim.betas", f"each must be in [0, 1), got {self.betas}")
        require(self.weight_decay >= 0, "optim.weight_decay", f"must be >= 0, got {self.weight_decay}")
        require(self.warmup_steps >= 0, "optim.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        require(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        require(self.grad_clip >= 0, "optim.grad_clip", f"must be >= 0 (0: off), got {self.grad_clip}")


@dataclass
class LoraConfig:
    # train a LoRA adapter (peft) instead of all weights. null: true when model.name is itself a LoRA
    # adapter (a run of sft/train with lora), whose adapter then trains on, with its own r, alpha,
    # dropout, target_modules; false on such a model merges the adapter and trains all weights
    enabled: bool | None = None
    r: int = 16  # adapter rank
    alpha: int = 32  # scaling: the adapter's update is multiplied by alpha / r
    dropout: float = 0.0  # dropout on the adapter's input
    # the linear layers that get an adapter (names inside each decoder layer)
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                                "gate_proj", "up_proj", "down_proj"])

    def validate(self) -> None:
        require(self.r >= 1, "lora.r", f"must be >= 1, got {self.r}")
        require(self.alpha > 0, "lora.alpha", f"must be > 0, got {self.alpha}")
        require(0 <= self.dropout < 1, "lora.dropout", f"must be in [0, 1), got {self.dropout}")

    def resolve(self, model: str) -> LoraConfig:
        """The LoRA in effect for `model` (enabled never null): a model that is a LoRA adapter
        continues it with its own shape unless enabled is false; any other model: these fields."""
        found = lora_adapter(model) if self.enabled is not False else None
        if found is None:
            return replace(self, enabled=bool(self.enabled))
        ad = found[1]
        targets = ad.get("target_modules") or self.target_modules
        return replace(self, enabled=True, r=int(ad.get("r", self.r)), alpha=ad.get("lora_alpha", self.alpha),
                       dropout=float(ad.get("lora_dropout", self.dropout)),
                       target_modules=sorted(targets) if isinstance(targets, list) else [str(targets)])


@dataclass
class RunConfig:
    dir: str = "runs/default"  # RUN_DIR: metrics.jsonl, tensorboard/, checkpoints/, config.yaml
    seed: int = 0  # the run's randomness: data order, sampling, initialisation of new weights
    save_every: int = 50  # checkpoint every n steps (and at the end); 0: only at the end
    keep_checkpoints: int = 2  # older checkpoints are deleted (the newest n kept)
    log_every: int = 1  # metrics.jsonl / tensorboard row every n steps (and the last)
    tensorboard: bool = True  # also write RUN_DIR/tensorboard/ (metrics.jsonl is always written)
    wandb: str | None = None  # a W&B project name to also log there (needs `pip install wandb`)
    trackio: str | None = None  # a trackio project name to also log there (local-first; pip install 'arpo[envs]')
    threads: int = 0  # torch CPU threads (0: leave torch's default)

    def validate(self) -> None:
        require(self.save_every >= 0, "run.save_every", f"must be >= 0 (0: only at the end), got {self.save_every}")
        require(self.keep_checkpoints >= 1, "run.keep_checkpoints", f"must be >= 1, got {self.keep_checkpoints}")
        require(self.log_every >= 1, "run.log_every", f"must be >= 1, got {self.log_every}")
        require(self.threads >= 0, "run.threads", f"must be >= 0 (0: torch's default), got {self.threads}")
        require(bool(str(self.dir).strip()), "run.dir", "must not be empty")


@dataclass
class RewardConfig:
    fn: str = "arpo"  # arpo (spec §5) | f1 | em | env | rg | module.path:function | weighted:... | judge:...
    math_scorer: str = "math_equal"  # math_equal (symbolic/numeric) | f1 (the reference's choice)
    # the arpo reward of a response that fails the format check (spec §5.1), by how it ended
    # (rewards/budget.py, docs/rewards.md): malformed text the model ended itself
    format_penalty: float = -1.0
    truncated_penalty: float | None = None  # no answer when the token budget cut it (null: format_penalty)
    call_cap_penalty: float | None = None  # no answer when it ended at the call cap (null: format_penalty)
    multi_tool_bonus: float = 0.1  # arpo: added to a positive score when both search and python were called
    # DAPO's soft overlong punishment (arXiv 2503.14476): the last L_cache tokens of the budget
    # (agent.max_response_tokens) cost up to overlong_penalty_factor, linearly
    overlong_buffer: int = 0  # L_cache; 0: off
    overlong_penalty_factor: float = 1.0  # the penalty at the budget (and for a response the budget cut)
    overlong_filter: bool = False  # DAPO's overlong filtering: a trajectory the token budget cut trains no token
    # tool productivity: off | otc (OTC-GRPO, arXiv 2504.14870: a positive reward times r_tool(m, n*),
    # m the response's calls, n* the fewest calls of a correct response in its group)
    tool_efficiency: str = "off"
    otc_c: float = 1.0  # otc: c of cos(m·π/(2m + c)) when the group's correct answers used no call

    def validate(self) -> None:
        require(self.overlong_buffer >= 0, "reward.overlong_buffer",
                f"must be >= 0 (0: off), got {self.overlong_buffer}")
        require(self.overlong_penalty_factor >= 0, "reward.overlong_penalty_factor",
                f"must be >= 0, got {self.overlong_penalty_factor}")
        require(self.tool_efficiency in ("off", "otc"), "reward.tool_efficiency",
                f"{self.tool_efficiency!r}; choose off or otc")
        require(self.otc_c > 0, "reward.otc_c", f"must be > 0, got {self.otc_c}")
        if self.fn != "arpo":
            for key, default in (("format_penalty", -1.0), ("truncated_penalty", None), ("call_cap_penalty", None),
                                 ("multi_tool_bonus", 0.1)):
                require(getattr(self, key) == default, f"reward.{key}",
                        f"applies to the arpo reward only (reward.fn is {self.fn!r})")

    def options(self) -> dict:
        """The keyword options of the arpo reward (rewards.get_reward_fn binds them)."""
        if self.fn != "arpo":
            return {}
        return {"format_penalty": self.format_penalty, "truncated_penalty": self.truncated_penalty,
                "call_cap_penalty": self.call_cap_penalty, "multi_tool_bonus": self.multi_tool_bonus}
