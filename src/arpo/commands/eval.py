"""`arpo eval`: pass@1 / pass@k, F1 or math accuracy, format errors and tool use, per dataset."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from arpo.commands import HELP, NONNEG, POS_INT, add_engine_flags
from arpo.commands.agent_flags import add_agent_flags
from arpo.errors import ArpoError

EXAMPLES = """examples:
  arpo eval --data gsm8k:test --limit 50                     # greedy, default model
  arpo eval --model runs/train --data hotpotqa:dev --tools search --limit 50
  arpo eval --model runs/sft --data a.jsonl b.jsonl --samples 5 --temperature 0.6 --out eval.json
  arpo eval --model runs/sft --data a.jsonl b.jsonl --samples 5 --temperature 0.6 --out eval.json --resume
                                                             # after Ctrl-C / SIGTERM / a crash: the rest only
  arpo eval --data bench:bamboogle --out ev.json --judge --judge-url http://127.0.0.1:8001/v1 \
            --judge-model Qwen2.5-72B-Instruct          # LLM-as-judge (key: $OPENAI_API_KEY)

  arpo eval --model ./Qwen3-8B-ARPO-DeepSearch --template arpo-deepsearch --data bench:bamboogle:dev

--model takes a Hugging Face dir, a built-in name, a checkpoint dir or a run dir (its latest
checkpoint). A released ARPO checkpoint's template (arpo-reasoning, arpo-deepsearch, ...) also sets
the tools, result format, tool-call cap, response budget and sampling its authors used, unless a
flag says otherwise. A run dir also gives its built-in tools, call format and budgets; its MCP servers,
your own tools, search URL and web URLs and key variables only with --trust-run-config (a run dir is
data, not code: arpo lists what it leaves out, or with the flag what it will run); --tools-config FILE
adds a tools section (e.g. `mcp: [{url: http://127.0.0.1:9000/mcp}]`).
Greedy (--temperature 0, eval's default) with --samples 1 gives deterministic numbers.
With --out, each finished batch of answers is appended to OUT.partial.jsonl; an interrupted evaluation
continues from there when the same command is run again with --resume (without it, an existing partial
file is an error, never silently recomputed), and OUT.partial.jsonl goes when OUT is written.
pass@k uses the unbiased estimator 1 - C(n-c,k)/C(n,k) over the n = --samples samples."""


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate an agent: pass@1/pass@k, F1/accuracy, format errors, tool calls",
                       description="Run the agent with real tools on one or more datasets and score it with the "
                       "reward's correctness check (spec §5).", epilog=EXAMPLES,
                       formatter_class=HELP)
    p.add_argument("--model", "--checkpoint", dest="model", default="smollm2-135m-instruct",
                   help="model dir, built-in name, checkpoint or run dir (default: %(default)s)")
    p.add_argument("--data", nargs="+", required=True, action="extend",
                   help="data specs: built-in names (svamp:test, gsm8k:test, hotpotqa:dev; `arpo data list`), "
                   "hf:NAME:SPLIT, JSONL/parquet files or globs")
    p.add_argument("--task", default=None, choices=["math", "qa"],
                   help="the task of every row: math (python, math equivalence) or qa (search, F1) "
                   "(default: each row's `task`, else inferred, and said so on stderr)")
    p.add_argument("--limit", type=POS_INT, default=None, help="questions per dataset (default: all)")
    p.add_argument("--samples", type=POS_INT, default=1, help="samples per question, k of pass@k")
    add_agent_flags(p, "eval")  # tools, template, budgets, sampling, seed, --tools-config, --web-*
    p.add_argument("--reward", default="arpo", help="reward/scorer: arpo, f1, em or module:function")
    p.add_argument("--math-scorer", default="math_equal", choices=["math_equal", "f1"],
                   help="how math answers are compared")
    p.add_argument("--batch-size", type=POS_INT, default=16, help="sequences decoded together")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    add_engine_flags(p, "the evaluation")
    p.add_argument("--compile", action="store_true",
                   help="hf engine: run each decode step as one torch.compile graph (compiled once per process: "
                        "minutes on a 2-core CPU, so it pays on long evaluations only; BENCHMARKS.md)")
    p.add_argument("--out", default=None, help="write the metrics (and per-sample records) as JSON here; while it "
                   "runs, finished answers are appended to OUT.partial.jsonl (removed when OUT is written)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted `arpo eval --out OUT` (Ctrl-C, SIGTERM, a crash) from the answers in "
                   "OUT.partial.jsonl, as `arpo train --resume` continues a run: the same command plus --resume; other "
                   "settings (model, data, samples, sampling, tools, ...) are refused, naming the first that differs")
    j = p.add_argument_group("LLM-as-judge (the paper's equivalence prompt; the judge sees only the extracted "
                             "answer, delimited as data: docs/judge.md)")
    j.add_argument("--judge", action="store_true",
                   help="also judge every answer with an LLM behind an OpenAI-compatible API: judge_pass@1/@k, "
                   "judge_failures (a failed judgment falls back to the rule-based check, never fatal)")
    j.add_argument("--judge-url", default=None, help="the judge's API root, e.g. http://127.0.0.1:8001/v1 "
                   "(default: $ARPO_JUDGE_URL)")
    j.add_argument("--judge-model", default=None,
                   help="the judge model's name at that API (default: $ARPO_JUDGE_MODEL)")
    j.add_argument("--judge-api-key-env", default="OPENAI_API_KEY",
                   help="environment variable that holds the judge API's key (unset: the key EMPTY, as theirs)")
    j.add_argument("--judge-cache", default=None,
                   help="JSONL of judgments reused on re-runs (default: next to --out, OUT.judge.jsonl)")
    j.add_argument("--judge-workers", type=POS_INT, default=8, help="judgments in flight at once")
    j.add_argument("--judge-retries", type=POS_INT, default=3, help="attempts per judgment")
    j.add_argument("--judge-timeout", type=POS_INT, default=120, help="seconds per judge request")
    j.add_argument("--judge-max-tokens", type=POS_INT, default=None, help="reply budget (default: the server's)")
    j.add_argument("--judge-temperature", type=NONNEG, default=0.0,
                   help="the judge's sampling temperature (default: 0)")
    j.add_argument("--judge-seed", type=int, default=None, help="the judge's sampling seed (sent only when set)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)
    c = sub.add_parser("compare", help="compare `arpo eval --out` JSON files side by side (before/after)",
                       description="One table per dataset: a row per eval file, with the change against the "
                       "first file; then each accuracy with its 95 % Wilson interval and the paired comparison of "
                       "each file with the one before it (questions newly solved / newly failed).",
                       epilog="example:\n  arpo compare base=runs/q/eval_base.json sft=runs/q/eval_sft.json "
                       "arpo=runs/q/eval_arpo.json\n\nA change is larger than the paired noise when "
                       "wins - losses > 2*sqrt(wins + losses) (src/arpo/eval/paired.py).",
                       formatter_class=HELP)
    c.add_argument("files", nargs="+", help="eval JSON files, optionally labelled: LABEL=FILE")
    c.add_argument("--json", action="store_true", help="print the rows as JSON")
    c.add_argument("--out", default=None, help="also write the rows as JSON here")
    c.set_defaults(func=run_compare)


def run(args) -> int:
    """The flags → EvalConfig → the recipe (recipes/eval.py) → the table or JSON."""
    from arpo.commands.from_run import template_line, tools_words
    from arpo.recipes import eval as recipe

    cfg = config_of(args)

    def announce(path: str, templates: list[str], tcfg, names: list[str]) -> None:
        if not args.quiet:
            print(template_line("eval", args.model, ", ".join(templates), cfg.template_source,
                                tools_words(tcfg, names)), file=sys.stderr)

    outcome = recipe.run(cfg, announce)
    if args.json:
        print(json.dumps({"model": args.model, "results": outcome.results}))
    else:
        print_table(outcome.results, args.model)
    # --out not written (a full disk): not a success, though the results are kept in a temporary file
    return outcome.exit_code(args.out)


def config_of(args):
    """EvalConfig of the flags, the run dir of --model and the template (agent_flags.resolve)."""
    from arpo.commands.agent_flags import resolve
    from arpo.settings import EvalConfig

    r = resolve(args, "eval")  # flags, --tools-config, the run dir, the template, the defaults
    return EvalConfig(data=list(args.data), model=args.model, task=args.task, limit=args.limit, samples=args.samples,
                      agent=r.agent, tools=r.tools, tools_chosen=r.tools_chosen, template=r.template,
                      template_source=r.source, trust_run_config=bool(getattr(args, "trust_run_config", False)),
                      seed=args.seed, reward=args.reward, math_scorer=args.math_scorer, batch_size=args.batch_size,
                      device=args.device, engine=args.engine, servers=list(args.servers or []), compile=args.compile,
                      out=args.out, resume=args.resume, judge=_judge_config(args), judge_cache=args.judge_cache,
                      progress=not (args.quiet or args.json))


def _judge_config(args):
    """The judge of --judge (None without it)."""
    import os

    if not args.judge:
        for flag in ("judge_url", "judge_model", "judge_cache"):
            if getattr(args, flag):
                raise ArpoError(f"--{flag.replace('_', '-')} needs --judge")
        return None
    from arpo.settings import JudgeConfig

    return JudgeConfig(base_url=args.judge_url or os.environ.get("ARPO_JUDGE_URL", ""),
                       model=args.judge_model or os.environ.get("ARPO_JUDGE_MODEL", ""),
                       api_key_env=args.judge_api_key_env, timeout_s=float(args.judge_timeout),
                       retries=args.judge_retries, workers=args.judge_workers, max_tokens=args.judge_max_tokens,
                       temperature=args.judge_temperature, seed=args.judge_seed)


def _label(spec: str) -> str:
    from arpo.recipes.eval import label

    return label(spec)


def print_table(results: dict, model: str) -> None:
    """A row per metric, a column per dataset (fits a narrow terminal)."""
    from rich.console import Console
    from rich.table import Table

    keys = ["questions", "samples"] + sorted({k for r in results.values() for k in r if k.startswith("pass@")}) + [
        "score", "reward", "format_error_rate", "tool_format_rate", "tool_calls", "response_tokens"] + sorted(
        {k for r in results.values() for k in r if k.startswith("judge_pass@")}) + ["judged", "judge_cached",
                                                                                   "judge_failures", "paper_score"]
    t = Table(title=f"arpo eval · {model}")
    t.add_column("metric")
    for path in results:
        t.add_column(_label(path), justify="right")
    for k in keys:
        if any(k in r for r in results.values()):
            t.add_row(k, *[f"{r[k]:.3f}" if isinstance(r.get(k), float) else str(r.get(k, ""))
                           for r in results.values()])
    Console().print(t)


def run_compare(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from arpo.eval.evaluate import COMPARE_KEYS, compare

    if args.out:
        from arpo.data.sources import input_paths
        from arpo.jsonl import prepare_output

        prepare_output(args.out, inputs=input_paths([s.rpartition("=")[2] for s in args.files]))
    runs = {}
    for spec in args.files:
        label, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        p = Path(path)
        if not p.is_file():
            raise ArpoError(f"{p}: no such eval file (write one with `arpo eval ... --out {p}`)")
        try:
            data = json.loads(p.read_text())
            data["results"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ArpoError(f"{p}: not an `arpo eval --out` file ({type(e).__name__}: {e})") from e
        name = label or p.stem
        if name in runs:  # a second file under one label used to replace the first, silently
            raise ArpoError(f"two eval files are labelled {name!r}; give each its own: LABEL=FILE")
        runs[name] = data
    rows = compare(runs)
    from arpo.eval.paired import compare_runs

    stats = compare_runs(runs)
    if args.out:
        from arpo.training.checkpoint import write_text_atomic

        write_text_atomic(Path(args.out), json.dumps({"rows": rows, **stats}, indent=1))
    if args.json:
        print(json.dumps({"rows": rows, **stats}))
        return 0
    con = Console(width=max(Console().width, 110))  # never wrap a row (pipes: 80 columns)
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == ds]
        t = Table(title=f"arpo compare · {_label(ds)}")  # a row per metric: fits a narrow terminal
        t.add_column("metric")
        for r in mine:
            t.add_column(r["label"], justify="right")
        for k in COMPARE_KEYS:
            if all(r[k] is None for r in mine):
                continue  # e.g. judge_pass@1 when no file was judged
            cells = []
            for r in mine:
                v, d = r[k], r.get("delta", {}).get(k)
                cells.append(("" if v is None else f"{v:.3f}") + ("" if d is None else f" ({d:+.3f})"))
            t.add_row(k, *cells)
        con.print(t)
    print_paired(con, stats)
    return 0


def print_paired(con, stats: dict) -> None:
    """Accuracy with its 95 % Wilson interval per file, and the paired wins/losses of consecutive files."""
    from rich.table import Table

    for ds in dict.fromkeys(s["dataset"] for s in stats["intervals"]):
        t = Table(title=f"accuracy with a 95 % Wilson interval · {_label(ds)}")
        for c in ("model", "questions", "accuracy", "95 % interval"):
            t.add_column(c, justify="right")
        for s in (s for s in stats["intervals"] if s["dataset"] == ds):
            t.add_row(s["label"], str(s["questions"]), f"{s['accuracy']:.3f}",
                      f"[{s['ci_low']:.3f}, {s['ci_high']:.3f}]")
        con.print(t)
    if not stats["paired"]:
        return
    t = Table(title="paired: questions the second model newly solves / newly fails "
              "(larger than the noise when net > 2·√(solves + fails))")
    for c in ("dataset", "change", "common", "newly solves", "newly fails", "net", "noise", "verdict", "sign p"):
        t.add_column(c, justify="right")
    for p in stats["paired"]:
        verdict = "significant" if p["significant"] else "noise"
        t.add_row(_label(p["dataset"]), f"{p['a']} → {p['b']}", str(p["common"]), str(p["wins"]), str(p["losses"]),
                  f"{p['net']:+d}", f"{p['noise']:.1f}", verdict, f"{p['p_sign']:.3g}")
    con.print(t)
