"""`arpo eval`'s settings (the recipe: recipes/eval.py): the model, the data, the agent and its tools
with eval's defaults, the scorer, the engine, the output and the LLM judge. The command fills it from
its flags (commands/eval.py), the run dir and the template (commands/agent_flags.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from arpo.errors import ArpoError
from arpo.settings.agent import AgentConfig, ToolsConfig, agent_defaults, tools_defaults
from arpo.settings.judge import JudgeConfig


@dataclass
class EvalConfig:
    data: list[str] = field(default_factory=list)  # data specs: built-in names, hf:NAME:SPLIT, files, globs
    model: str = "smollm2-135m-instruct"  # HF dir, built-in name, checkpoint or run dir (its latest checkpoint)
    task: str | None = None  # math | qa for every row (default: each row's `task`, else inferred)
    limit: int | None = None  # questions per dataset (None: all)
    samples: int = 1  # samples per question, the k of pass@k
    # the agent and its tools: the sections of settings/agent.py, with eval's defaults (settings.COMMAND_DEFAULTS)
    agent: AgentConfig = field(default_factory=lambda: agent_defaults("eval"))  # agent.*, eval's defaults
    tools: ToolsConfig = field(default_factory=lambda: tools_defaults("eval"))  # tools.*, eval's defaults
    tools_chosen: bool = False  # the tools were chosen (flag, file, run, template); else each dataset's task's
    template: str | None = None  # the prompt template (None: chosen from the tools and the task)
    template_source: str = "chosen from the tools and the task"  # where the template comes from (said on stderr)
    trust_run_config: bool = False  # a run dir's chat template renders (bounded) only with --trust-run-config
    seed: int = 0  # sample j of the whole evaluation is seeded seed * 1_000_003 + j
    reward: str = "arpo"  # reward/scorer: arpo, f1, em, module:function, judge:URL?model=NAME
    math_scorer: str = "math_equal"  # math_equal | f1
    batch_size: int = 16  # sequences decoded together
    device: str = "auto"  # auto, cpu, cuda or cuda:N
    engine: str = "hf"  # hf | vllm | vllm_server (running vLLM servers that serve `model`: `servers`)
    servers: list[str] = field(default_factory=list)  # vllm_server: the servers' base URLs
    compile: bool = False  # hf: each decode step one torch.compile graph
    out: str | None = None  # the metrics and per-sample records as JSON (None: not written)
    # continue the interrupted evaluation whose finished answers are in OUT's partial file (eval/partial.py)
    resume: bool = False
    judge: JudgeConfig | None = None  # also judge every answer with this LLM (None: no judge)
    judge_cache: str | None = None  # JSONL of judgments reused on re-runs (None: OUT.judge.jsonl)
    progress: bool = True  # progress lines on stderr

    def validate(self) -> None:
        if not self.data:
            raise ArpoError("--data: give at least one data spec")
        if self.samples < 1 or self.batch_size < 1 or (self.limit is not None and self.limit < 1):
            raise ArpoError("--samples, --batch-size and --limit must be >= 1")
        if self.samples > 1 and self.agent.temperature == 0:
            raise ArpoError("--samples > 1 with --temperature 0 gives identical samples; set --temperature > 0")
        if self.compile and self.engine != "hf":
            raise ArpoError("--compile: only for --engine hf (vLLM compiles its own graphs)")
        if self.engine == "vllm_server" and not self.servers:
            raise ArpoError("--engine vllm_server needs --servers URL ... (the servers that serve --model; "
                            "`arpo rollout-servers` starts them)")
        if self.servers and self.engine != "vllm_server":
            raise ArpoError("--servers goes with --engine vllm_server (the URLs of servers that serve --model)")
        if self.resume and not self.out:
            raise ArpoError("--resume needs --out: the finished answers of an interrupted run are kept next to it")
        if self.judge is not None:
            self.judge.validate()  # a bad judge flag fails before the model loads
