"""`arpo export MODEL --out DIR`: a trained model as a plain Hugging Face directory.

MODEL is a run of `arpo sft` / `arpo train` (its latest checkpoint), a checkpoint, a LoRA adapter
directory or a model directory. A LoRA adapter is merged into its base model (peft's
merge_and_unload), so DIR loads with `AutoModelForCausalLM.from_pretrained(DIR)`, vLLM or
`arpo chat --model DIR` without peft. The run's prompt template, tools and call format go with it
(DIR/agent.yaml, read by chat / eval / serve as a run dir's are: commands/from_run.py)."""

from __future__ import annotations

import json
from pathlib import Path

from arpo.commands import HELP
from arpo.errors import ArpoError

EXAMPLES = """examples:
  arpo export runs/sft --out models/sft-merged        # a LoRA run: the adapter merged into its base
  arpo export runs/train/checkpoints/step_000050 --out models/step50 --dtype bfloat16
  arpo chat --model models/sft-merged "What is 17 * 23?"   # the run's template and tools come along"""

DTYPES = ("auto", "float32", "bfloat16", "float16")


def register(sub) -> None:
    p = sub.add_parser("export", help="write a run's model (LoRA adapter merged) as a plain Hugging Face directory",
                       description=__doc__, epilog=EXAMPLES, formatter_class=HELP)
    p.add_argument("model", metavar="MODEL", help="run dir, checkpoint, LoRA adapter or model directory")
    p.add_argument("--out", required=True, help="output directory (new, or empty)")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="weights' dtype (auto: the base model's stored dtype, else float32)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    p.set_defaults(func=run_export)


def stored_dtype(model_dir: Path) -> str:
    """The dtype a model directory's config.json records (`dtype` or `torch_dtype`), float32 when it
    records none or one not in DTYPES."""
    try:
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "float32"
    d = cfg.get("dtype") or cfg.get("torch_dtype") if isinstance(cfg, dict) else None
    return d if d in DTYPES[1:] else "float32"


def remembered_agent(model: str) -> dict:
    """The run's agent settings (template, tools, call format, ...) as config sections, for DIR/agent.yaml
    (read back by commands/from_run.py like a run's own)."""
    from arpo.commands.from_run import run_settings

    got = run_settings(model)
    out = {k: got[k] for k in ("tools", "agent") if got.get(k)}
    if got.get("template") is not None:
        out["data"] = {"template": got["template"]}
    return out


def run_export(args) -> int:
    import yaml

    from arpo.jsonl import prepare_output
    from arpo.models import check_model, load_model, lora_adapter, resolve_model_dir

    src = check_model(args.model, "cpu")  # one clear line for a path that is no model, before any loading
    out = Path(args.out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ArpoError(f"--out {out}: exists and is not an empty directory; give a new one")
    prepare_output(out, directory=True)  # writable, before the weights load
    adapter = lora_adapter(args.model)
    base_dir = resolve_model_dir(adapter[1]["base_model_name_or_path"]) if adapter else src
    dtype = stored_dtype(base_dir) if args.dtype == "auto" else args.dtype
    model, tok = load_model(args.model, "cpu", dtype)  # an adapter is merged (merge_and_unload)
    tmp = out.parent / f".{out.name}.partial"
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        agent = remembered_agent(args.model)
        if agent:
            (tmp / "agent.yaml").write_text(f"# the prompts {args.model} was trained with (arpo export; "
                                            "arpo.commands.from_run)\n" + yaml.safe_dump(agent, sort_keys=False))
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    n = sum(p.numel() for p in model.parameters())
    summary = {"out": str(out), "from": str(src), "merged_adapter": adapter is not None, "dtype": dtype,
               "parameters": n, "agent": agent}
    if args.json:
        print(json.dumps(summary))
    else:
        what = "LoRA adapter merged into " + str(base_dir) if adapter else "model"
        print(f"arpo export: wrote {out} ({what}; {n:,} parameters, {dtype})"
              + (f"; template/tools: {agent}" if agent else ""))
    return 0
