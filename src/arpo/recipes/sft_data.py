"""`arpo sft-data`: cold-start SFT data from real datasets with real tool outputs — no external LLM
(spec §6). The converters (GSM8K, SVAMP, HotpotQA, hop2, rejection sampling, your own tools' worked
examples) are sft/convert.py; the row layout, and how rows are written with the reasons others were
dropped, sft/rows.py. These functions load the data and the tools, convert until `limit` rows check
out and write the JSONL."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import arpo.models
from arpo.data.datasets import load_examples
from arpo.data.prompts import default_template, system_prompt
from arpo.data.sources import iter_rows
from arpo.errors import ArpoError
from arpo.eval.evaluate import evaluate
from arpo.models import resolve_model_dir
from arpo.rewards import arpo_reward
from arpo.rewards.answer import extract_answer_block, extract_boxed
from arpo.rollout.tool_formats import tool_schema
from arpo.settings import AgentConfig, ToolsConfig, agent_defaults, tools_defaults
from arpo.sft.convert import gsm8k_to_sft, hop2_sft_rows, hotpotqa_to_sft, rejection_rows, svamp_to_sft, tools_to_sft
from arpo.sft.rows import convert_rows, row_stats, write_rows
from arpo.tools import tools_from_config
from arpo.training.progress import Bar

SFT_SOURCES = ("gsm8k", "hotpotqa", "svamp", "hop2")


def build_sft_dataset(task: str, in_path: str, out_path: str, limit: int | None = None, *,
                      tools_cfg: ToolsConfig | None = None, progress: bool = True,
                      style: str = "single", max_calls: int | None = None) -> dict:
    """Convert `limit` rows (kept rows, not read rows) and write JSONL atomically. Returns stats.
    `tools_cfg`: the search / python settings (default: sft-data's, settings.COMMAND_DEFAULTS);
    `max_calls`: gsm8k stepwise's cap (default: sft-data's agent.max_tool_calls)."""
    if task not in SFT_SOURCES:
        raise ArpoError(f"unknown SFT source {task!r}; use {', '.join(SFT_SOURCES)}")
    if max_calls is None:
        max_calls = agent_defaults("sft-data").max_tool_calls
    p = in_path  # a data spec: built-in name (gsm8k:train), file, glob or hf:...
    tcfg = tools_cfg or tools_defaults("sft-data")
    if task == "hop2":
        return _hop2_dataset(p, out_path, limit, tcfg, progress)
    enabled = ["search"] if task == "hotpotqa" else ["python"]
    tools = tools_from_config(replace(tcfg, enabled=enabled, mcp=[], options={}))
    try:
        if task in ("gsm8k", "svamp"):
            src = load_examples(p)
        else:
            src = [row for _, row in iter_rows(p)]

        def convert(ex):
            if task == "gsm8k":
                return gsm8k_to_sft(ex, tools["python"], style=style, max_calls=max_calls)
            if task == "svamp":
                return svamp_to_sft(ex, tools["python"])
            return hotpotqa_to_sft(ex, lambda q: tools["search"](q).output)

        rows, reasons = convert_rows(src, convert, limit, progress, f"sft-data {task}")
    finally:
        tools.close()
    return row_stats(rows, reasons, write_rows(out_path, rows, reasons))


def _hop2_dataset(data: str, out_path: str, limit: int | None, tools_cfg: ToolsConfig, progress: bool) -> dict:
    """hop2's scripted trajectories (hop2_sft_rows) of `data`, through convert_rows like the other
    sources (`limit`: rows kept); a row whose trajectory does not reach the question's answer through
    the tool is dropped ("answer not reached")."""
    def check(row):
        ok = extract_boxed(extract_answer_block(row["response"])) in row["answers"]
        return (row, "ok") if ok else (None, "answer not reached")

    rows, reasons = convert_rows(hop2_sft_rows(load_examples(data), tools_cfg), check, limit, progress,
                                  "sft-data hop2")
    return row_stats(rows, reasons, write_rows(out_path, rows, reasons))


def build_rejection_dataset(model: str, data: str, out_path: str, *, samples: int = 4, limit: int | None = None,
                            agent: AgentConfig | None = None, tools_cfg: ToolsConfig | None = None,
                            tools: list[str] | None = None, template: str | None = None,
                            progress: bool = True) -> dict:
    """Sample `samples` trajectories per question with real tools, keep those with reward > 0.
    `agent`: budgets and sampling (default: sft-data's, settings.COMMAND_DEFAULTS); `tools_cfg`: the
    tools' settings; `tools`: their names (default: python for math rows, search for QA rows);
    `template`: the prompt template (default: chosen from the tools and the task; the rows record it)."""
    from arpo.engine.hf import HFEngine  # noqa: PLC0415 - loads torch; kept out of this light module's import

    agent = agent or agent_defaults("sft-data")
    exs = load_examples(data, limit)
    names = tools or (["python"] if all(e["task"] == "math" for e in exs) else ["search"])
    reg = tools_from_config(replace(tools_cfg or tools_defaults("sft-data"), enabled=names))
    m, tok = arpo.models.load_model(model)
    recs: list = []
    try:
        with Bar(enabled=progress) as bar:
            t = bar.add_task("rejection sampling", total=len(exs) * samples)
            stats = evaluate(HFEngine(m, tok), reg, tok, exs, reward_fn=arpo_reward,
                             agent=agent, samples=samples, template=template,
                             temperature=agent.temperature, records_out=recs,
                             progress=lambda n: bar.advance(t, n))
    finally:
        reg.close()
    rows = rejection_rows(recs, {e["id"]: e for e in exs})
    out = write_rows(out_path, rows, Counter({"no trajectory with reward > 0": len(exs)}))
    return {"written": len(rows), "sampled": len(recs), "questions": len(exs), "pass@1": stats["pass@1"],
            "out": str(out)}


def build_tool_sft(data: str, out_path: str, tool_names: list[str], tool_format: str = "tags",
                   model: str = "smollm2-135m-instruct", template: str | None = None, limit: int | None = None,
                   progress: bool = True, tools_cfg: ToolsConfig | None = None) -> dict:
    """`arpo sft-data tools`: worked examples of your tools -> SFT JSONL (rows that check out).
    `tools_cfg`: the tools' settings (tools.options of yours, MCP servers, ...), `tool_names` enabled."""
    tok = _load_tokenizer(model)
    tools = tools_from_config(replace(tools_cfg or tools_defaults("sft-data"), enabled=list(tool_names)))
    try:
        system = system_prompt(template or default_template(tools), tools, tool_format=tool_format)
        schemas = [tool_schema(tools[n]) for n in tools.names]
        rows, reasons = convert_rows(
            list(iter_rows(data)), lambda wr: tools_to_sft(wr[1], tools, tok, tool_format, system, schemas, wr[0]),
            limit, progress, "sft-data tools")
    finally:
        tools.close()
    return row_stats(rows, reasons, write_rows(out_path, rows, reasons))


def _load_tokenizer(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(resolve_model_dir(model)))
