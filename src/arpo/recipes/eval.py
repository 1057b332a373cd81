"""Evaluation recipe (spec §6): each dataset → the agent with real tools → scores (→ the LLM judge) → JSON.

    arpo eval --model runs/sft --data gsm8k:test --limit 50 --out ev.json [--resume]

In order: check what fails in a second (the reward, the data, the web's keys and the local web,
--out, the judge's settings) → open the partial file, the judge and the engine, each closed on every
way out (`closing` in one ExitStack: an error, Ctrl-C and SIGTERM included) → per dataset: its tools,
the evaluation (each finished batch appended to OUT's partial file, eval/partial.py), the judge's
verdicts, the paper's metric → the JSON file. Ctrl-C keeps every finished answer: --out gets the
summary of what finished (marked interrupted), and `--resume` continues from the partial file.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack, closing
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from arpo.chat_templates import guard_tokenizer
from arpo.data.benchmarks import metric_of
from arpo.data.datasets import load_examples
from arpo.data.prompts import templates_for
from arpo.data.sources import builtin_agent, describe, input_paths
from arpo.engine import make_engine
from arpo.errors import ArpoError
from arpo.eval.evaluate import evaluate, summarize
from arpo.eval.judge import Judge, JudgeCache, default_cache_path
from arpo.eval.judge_reward import reward_from_spec
from arpo.eval.partial import PartialRun
from arpo.jsonl import prepare_output
from arpo.models import load_model, model_source, resolve_model_dir
from arpo.rewards.custom import check_reward
from arpo.settings import EvalConfig, ToolsConfig
from arpo.settings.agent import agent_record
from arpo.tools import check_web, tools_from_config
from arpo.training.progress import Bar, Heartbeat

# announce(spec, templates used, tools config, tool names): the command's line about a dataset's prompt
Announce = Callable[[str, list[str], ToolsConfig, list[str]], None]


@dataclass
class EvalOutcome:
    results: dict[str, dict] = field(default_factory=dict)  # dataset spec -> metrics
    records: dict[str, list[dict]] = field(default_factory=dict)  # dataset spec -> per-sample records
    interrupted: bool = False  # Ctrl-C / SIGTERM: the results are those of the finished answers
    written: Path | None = None  # where the JSON went: cfg.out, or a temporary file when it could not be written

    def exit_code(self, out: str | None) -> int:
        """130 interrupted, 1 when --out could not be written (kept in a temporary file), else 0."""
        return 130 if self.interrupted else 1 if out and self.written != Path(out) else 0


def run(cfg: EvalConfig, announce: Announce | None = None) -> EvalOutcome:
    """checks → partial file, judge, engine (each closed on every way out) → each dataset → --out."""
    cfg.validate()
    check_engine(cfg)
    reward_fn = reward_from_spec(cfg.reward)
    datasets = {d: load_examples(d, cfg.limit, cfg.task) for d in cfg.data}
    for path, examples in datasets.items():  # a broken reward, a web key, the local web: before the model loads
        check_reward(reward_fn, examples, cfg.math_scorer, cfg.reward)
        tcfg0 = tools_for(cfg, path, examples)[0]
        tcfg0.check_keys()
        check_web(tcfg0)
    if cfg.out:  # before the long part: a bad --out must not lose the results
        prepare_output(cfg.out, inputs=input_paths(cfg.data))
    with ExitStack() as stack:
        partial = None
        if cfg.out:
            partial, n = PartialRun.open(cfg.out, identity(cfg, datasets), cfg.resume)
            stack.enter_context(closing(partial))
            if cfg.resume:
                total = sum(len(ex) for ex in datasets.values()) * cfg.samples
                print(f"arpo eval: resuming {partial.path}: {n} of {total} answers finished" if n else
                      f"arpo eval: --resume: nothing to resume in {partial.path}; starting from the first question",
                      file=sys.stderr)
        judge = None
        if cfg.judge is not None:
            judge = stack.enter_context(closing(Judge(cfg.judge, JudgeCache(cfg.judge_cache
                                                                           or default_cache_path(cfg.out)))))
        source = model_source(cfg.model)  # resolved once: a run dir's latest checkpoint may change meanwhile
        engine, tok = load_engine(cfg, stack, source["model_dir"])
        outcome = evaluate_all(cfg, datasets, engine, tok, reward_fn, judge, partial, announce)
    if cfg.out:
        settings = agent_record(cfg.template, cfg.tools, cfg.tools_chosen, cfg.agent)
        text = json.dumps({**source, "temperature": cfg.agent.temperature, "settings": settings,
                           "results": outcome.results, "records": outcome.records,
                           **({"interrupted": True} if outcome.interrupted else {})}, indent=1)
        outcome.written = write_out(Path(cfg.out), text)
        if partial is not None and not outcome.interrupted and outcome.written == Path(cfg.out):
            partial.remove()  # the finished evaluation is in --out
    return outcome


def evaluate_all(cfg: EvalConfig, datasets: dict[str, list[dict]], engine, tok, reward_fn, judge: Judge | None,
                 partial: PartialRun | None, announce: Announce | None) -> EvalOutcome:
    """Each dataset in turn with its own tools (closed after it); Ctrl-C keeps the finished answers."""
    o = EvalOutcome()
    with Bar(enabled=cfg.progress) as bar:
        try:
            for path, examples in datasets.items():
                tcfg, template = tools_for(cfg, path, examples)
                with closing(tools_from_config(tcfg)) as tools:
                    if announce is not None:  # the templates and tools in use, not "default"
                        announce(path, templates_for(examples, tools, template), tcfg, list(tools.names))
                    task = bar.add_task(label(path), total=len(examples) * cfg.samples)
                    done = partial.done(path) if partial is not None else []
                    bar.advance(task, len(done))
                    recs: list = []
                    o.records[path] = recs  # filled as answers finish (also when interrupted)
                    o.results[path] = evaluate(
                        engine, tools, tok, examples, reward_fn=reward_fn, agent=cfg.agent, samples=cfg.samples,
                        temperature=cfg.agent.temperature, template=template, seed=cfg.seed,
                        math_scorer=cfg.math_scorer, batch_size=cfg.batch_size,
                        progress=lambda n, t=task: bar.advance(t, n), records_out=recs, done=done,
                        on_batch=None if partial is None else lambda b, rs, p=path: partial.add(p, b, rs),
                        heartbeat=Heartbeat(f"arpo eval {label(path)}", enabled=cfg.progress))
                    o.results[path]["tools"] = list(tools.names)
                if judge is not None:
                    o.results[path].update(judge.judge_records(recs, {ex["id"]: ex["question"] for ex in examples},
                                                               cfg.samples))
                    report_judge_failures(label(path), o.results[path])
                paper_metric(path, o.results[path], judged=judge is not None)
        except KeyboardInterrupt:
            o.interrupted = True
            for path, recs in o.records.items():
                if path not in o.results and recs:
                    o.results[path] = summarize(recs, cfg.samples) | {"interrupted": True}
            n = sum(len(r) for r in o.records.values())
            print(f"arpo eval: interrupted; {n} finished answers kept" + (
                f" in {cfg.out} (add --resume to the same command to continue)" if cfg.out else ""), file=sys.stderr)
    return o


def check_engine(cfg: EvalConfig) -> None:
    if cfg.engine == "vllm":
        from arpo.engine.vllm import INSTALL_HINT, vllm_available  # noqa: PLC0415 - loads torch; kept out of this light module's import

        if not vllm_available():
            raise ArpoError(f"--engine vllm: {INSTALL_HINT}")


def load_engine(cfg: EvalConfig, stack: ExitStack, model_dir: str | None = None):
    """(engine, tokenizer) of `model_dir` (default: cfg.model resolved); the engine is closed when
    `stack` ends."""
    model_dir = model_dir or str(resolve_model_dir(cfg.model))
    if cfg.engine == "vllm_server":  # the servers hold the weights: only the tokenizer is loaded here
        engine = stack.enter_context(closing(make_engine("vllm_server", None, None, model_dir=model_dir,
                                                         servers=cfg.servers)))
        return engine, guard_tokenizer(engine.tokenizer, cfg.model, cfg.trust_run_config, "eval")
    model, tok = load_model(model_dir, device=cfg.device)
    guard_tokenizer(tok, cfg.model, cfg.trust_run_config, "eval")
    engine = make_engine(cfg.engine, model, tok, model_dir=model_dir, **({"compile": True} if cfg.compile else {}))
    return stack.enter_context(closing(engine)), tok


def tools_for(cfg: EvalConfig, path: str, examples: list[dict]) -> tuple[ToolsConfig, str | None]:
    """(tools config, template) that dataset `path` is evaluated with: the chosen ones, else the
    dataset's own (hop2, webhop: the tools their task is posed with), else the task's ([] is a choice)."""
    tcfg = cfg.tools
    own_tools, own_template = builtin_agent(path)
    if not cfg.tools_chosen:
        tcfg = replace(tcfg, enabled=list(own_tools) or (
            ["python"] if all(ex["task"] == "math" for ex in examples) else ["search"]))
    return tcfg, cfg.template or own_template


def identity(cfg: EvalConfig, datasets: dict[str, list[dict]]) -> dict:
    """What makes two runs' answers the same answers (a resumed run must match it): the model (a run
    dir: the checkpoint it resolves to), the questions (a digest of each dataset's rows), the samples,
    the seed, the agent and its tools, the template and the scorer. The batch size, the engine and the
    judge may change."""
    model_dir = str(resolve_model_dir(cfg.model)) if Path(cfg.model).expanduser().is_dir() else None
    digest = {d: hashlib.sha256(json.dumps(ex, sort_keys=True, default=str).encode()).hexdigest()[:16]
              for d, ex in datasets.items()}
    return {"model": cfg.model, "model_dir": model_dir, "data": list(cfg.data), "questions": digest,
            "samples": cfg.samples, "seed": cfg.seed, "agent": asdict(cfg.agent),
            "tools": json.loads(json.dumps(asdict(cfg.tools), default=str)), "tools_chosen": cfg.tools_chosen,
            "template": cfg.template, "reward": cfg.reward, "math_scorer": cfg.math_scorer}


def write_out(path: Path, text: str) -> Path:
    """Write the finished evaluation to --out; when that fails (a full disk, a removed folder) keep it in
    a temporary file and say where, instead of losing an evaluation that may have taken hours."""
    from arpo.training.checkpoint import write_text_atomic  # noqa: PLC0415 - loads torch; kept out of this light module's import

    try:
        write_text_atomic(path, text)
        return path
    except OSError as e:
        fd, spare = tempfile.mkstemp(prefix="arpo-eval-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
        except OSError:
            Path(spare).unlink(missing_ok=True)
            raise e from None
        print(f"arpo eval: could not write {path} ({e.strerror}); the evaluation is kept in {spare}", file=sys.stderr)
        return Path(spare)


def paper_metric(spec: str, r: dict, judged: bool) -> None:
    """For the paper's benchmarks (bench:NAME): the metric the paper reports and its value here
    (f1: the score; llm-judge: judge_pass@1, which needs --judge)."""
    m = metric_of(spec)
    if m is None:
        return
    r["paper_metric"] = m
    if m == "f1":
        r["paper_score"] = r["score"]
    elif judged:
        r["paper_score"] = r["judge_pass@1"]
    else:
        print(f"arpo eval: {spec}: the paper reports LLM-as-judge accuracy here; add --judge --judge-url URL "
              "--judge-model NAME for it", file=sys.stderr)


def report_judge_failures(name: str, r: dict) -> None:
    if r.get("judge_failures"):
        print(f"arpo eval: {name}: {r['judge_failures']} of {r['judged'] + r['judge_failures']} judgments failed "
              f"({r.get('judge_first_error')}); those samples count by the rule-based check", file=sys.stderr)


def label(spec: str) -> str:
    """A dataset's column title: a built-in or hf: name as given, a file as parent/name."""
    p = Path(spec)
    return describe(spec) if describe(spec) != p.name else f"{p.parent.name}/{p.name}".lstrip("/")
