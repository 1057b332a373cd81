"""Every config a user edits, in one package: YAML and flags → these dataclasses (loaded and checked by
config.py), each field documented once, on its line. By command and topic:

    sections.py  what every command shares: model, data, optim, lora, run, reward
    agent.py     the agent's tools (ToolsConfig; ToolOptions: tools.options.NAME of your own tools) and one
                 trajectory's budget and sampling; COMMAND_DEFAULTS, where a command's defaults differ from train's
    rollout.py   the ARPO tree per prompt (rollout.*), the branch rules' names; `arpo rollout`'s config
    train.py     `arpo train`: algo, validation, memory, run and the step's own knobs (TrainConfig)
    engine.py    `engine_options` (EngineOptions): the rollout engine's keywords, by the engines that read them
    sft.py       `arpo sft` (SFTConfig)
    serve.py     `arpo serve agent` (ServeConfig)
    eval.py      `arpo eval` (EvalConfig)
    judge.py     the LLM judge of `arpo eval --judge-*` (JudgeConfig)
    web.py       the web tools, `tools.web` (WebConfig: provider, keys, browse's limits, the summarizer)

The experiments' study configs stay beside their studies (experiments/). `from arpo.settings import X`
works for every name here. This package sits below the parts that use it: it imports arpo's leaves
(errors, plugins; config, the loader, which parses a library caller's dict: web_config, tool_options) and,
inside the checks that need them, the registries it validates against (models, engine, algos.presets),
none of which imports it. The tools read their defaults and names from here
(agent.py) and build a registry from a ToolsConfig (tools.tools_from_config).
"""

from arpo.settings.agent import (
    COMMAND_DEFAULTS,
    AgentConfig,
    ToolOptions,
    ToolsConfig,
    agent_defaults,
    command_defaults,
    tool_options,
    tools_defaults,
)
from arpo.settings.engine import EngineOptions
from arpo.settings.eval import EvalConfig
from arpo.settings.judge import JudgeConfig
from arpo.settings.rollout import (
    BRANCH_RULES,
    RENAMED_BRANCH_RULES,
    BranchRule,
    RolloutConfig,
    RolloutJobConfig,
    auto_rule_name,
    branch_rule_is_staged,
    load_branch_rule,
    rule_lines,
    rule_summaries,
)
from arpo.settings.sections import DataConfig, LoraConfig, ModelConfig, OptimConfig, RewardConfig, RunConfig
from arpo.settings.serve import MAX_REQUEST_BYTES, ServeConfig
from arpo.settings.sft import SFTConfig, SFTDataConfig
from arpo.settings.train import AlgoConfig, MemoryConfig, MonitorConfig, TrainConfig, TrainRunConfig, ValidationConfig
from arpo.settings.web import WebConfig, web_config

__all__ = [
    "BRANCH_RULES", "COMMAND_DEFAULTS", "MAX_REQUEST_BYTES", "RENAMED_BRANCH_RULES", "AgentConfig", "AlgoConfig",
    "BranchRule", "DataConfig", "EngineOptions", "EvalConfig", "JudgeConfig", "LoraConfig", "MemoryConfig",
    "ModelConfig",
    "MonitorConfig", "OptimConfig", "RewardConfig", "RolloutConfig", "RolloutJobConfig", "RunConfig", "SFTConfig",
    "SFTDataConfig", "ServeConfig", "ToolOptions", "ToolsConfig", "TrainConfig", "TrainRunConfig", "ValidationConfig",
    "WebConfig", "agent_defaults", "auto_rule_name", "branch_rule_is_staged", "command_defaults", "load_branch_rule",
    "rule_lines", "rule_summaries", "tool_options", "tools_defaults", "web_config",
]
