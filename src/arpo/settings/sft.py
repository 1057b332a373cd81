"""`arpo sft`'s config (cold-start SFT, spec §6; the recipe: recipes/sft.py): the shared sections with
SFT's defaults, the data files and the step's own knobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from arpo.errors import ArpoError, require
from arpo.settings.sections import LoraConfig, ModelConfig, OptimConfig, RunConfig


@dataclass
class SFTDataConfig:
    path: list[str] = field(default_factory=lambda: ["sft_gsm8k.jsonl"])  # JSONL file(s) of `arpo sft-data`
    limit: int | None = None  # use only the first N rows (after concatenating the files)
    max_seq_len: int = 1024  # rows longer than this (prompt + response tokens) are skipped, counted


@dataclass
class SFTMemoryConfig:
    """What bounds an SFT step's activation memory (besides micro_tokens)."""

    # recompute each decoder layer's activations in the backward instead of keeping them (as `arpo
    # train`'s memory.activation_checkpointing): about one more forward of compute, a fraction of the memory
    activation_checkpointing: bool = False


@dataclass
class SFTConfig:
    model: ModelConfig = field(default_factory=ModelConfig)  # the model to fine-tune
    data: SFTDataConfig = field(default_factory=SFTDataConfig)  # worked examples (rows: `arpo sft-data`)
    # optimizer and learning-rate schedule
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-5, schedule="cosine", warmup_steps=2))
    lora: LoraConfig = field(default_factory=LoraConfig)  # train a LoRA adapter instead of all weights
    run: RunConfig = field(default_factory=lambda: RunConfig(dir="runs/sft"))  # where and how it is saved
    prompts_per_step: int = 8  # rows (prompts with their responses) per optimizer step (was: batch_size)
    epochs: int = 1  # passes over the data (unless steps stops earlier)
    steps: int | None = None  # stop after this many steps (default: epochs over the data) (was: max_steps)
    micro_tokens: int = 2048  # tokens per forward/backward micro-batch (bounds activation memory)
    memory: SFTMemoryConfig = field(default_factory=SFTMemoryConfig)  # activation checkpointing
    # the old spellings, still read with a warning: `arpo train`'s names are the ones (issue 29)
    RENAMED: ClassVar[dict[str, str]] = {"max_steps": "steps", "batch_size": "prompts_per_step"}

    def validate(self) -> None:
        self.optim.validate()
        if self.prompts_per_step < 1:
            raise ArpoError(f"prompts_per_step must be >= 1, got {self.prompts_per_step}")
        if self.epochs < 1:
            raise ArpoError("epochs must be >= 1")

        require(self.steps is None or self.steps >= 1, "steps", f"must be >= 1 (or null), got {self.steps}")
        require(self.micro_tokens >= 1, "micro_tokens", f"must be >= 1, got {self.micro_tokens}")
        require(self.data.max_seq_len >= 1, "data.max_seq_len", f"must be >= 1, got {self.data.max_seq_len}")
        require(self.data.limit is None or self.data.limit >= 1, "data.limit",
                f"must be >= 1 (or null), got {self.data.limit}")
        for sec in (self.model, self.lora, self.run):
            sec.validate()
