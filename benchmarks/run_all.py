"""Run every benchmark side by side and write BENCHMARKS.md (issue 6).

    python benchmarks/run_all.py [--json] [--quick] [--skip decode,tools,rollout,training,trl]

Each benchmark is its own script (run here as a subprocess so their peak memories do not mix);
their medians go into one table: what, how, arpo, baseline, ratio, goal.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(script: str, args: list[str]) -> dict:
    r = subprocess.run([sys.executable, str(HERE / script), "--json", *args], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr[-1500:]}
    return json.loads(r.stdout[r.stdout.index("{"):])


def rows(res: dict) -> list[tuple]:
    out = []
    d, t, tr = res.get("decode", {}), res.get("tools", {}), res.get("training", {})
    ro = res.get("rollout", {})
    if "wall_ratio" in ro:
        a, n = ro["arpo"], ro["naive"]
        out.append((f"rollout, {ro['prompts']} GSM8K prompts x M={ro['group_size']}, real python, "
                    "s per generated token",
                    "bench_rollout.py",
                    f"{a['seconds']:.1f} s / {a['generated_tokens']} tok ({a['branches']} branches)",
                    f"naive generate-per-turn {n['seconds']:.1f} s / {n['generated_tokens']} tok",
                    f"{ro['per_token_ratio']:.2f} (wall {ro['wall_ratio']:.2f})", "<= 0.4"))
    if "decode_tok_s_engine" in d:
        batches = [(d["batch"], d)] + [(int(k[6:]), v) for k, v in d.items() if k.startswith("batch_")]
        for b, r in batches:
            what = f"decode tok/s, batch {b}, {d['prompt_tokens']}+{d['new_tokens']} tokens"
            base = f"HF generate {r['decode_tok_s_generate']:.1f}"
            out.append((what + ", arpo's forward (default)", "bench_decode.py", f"{r['decode_tok_s_engine']:.1f}", base,
                        f"{r['decode_ratio_vs_generate']:.2f}x", ">= 2.0x"))
            if "decode_tok_s_compiled" in r:
                how = (f"compiled once in {r['compile_s']:.0f} s" if r["compile_s"] >= 1
                       else "the graph compiled before, dynamic shapes")
                out.append((what + f", compiled step (torch.compile, {how})",
                            "bench_decode.py", f"{r['decode_tok_s_compiled']:.1f}", base,
                            f"{r['decode_ratio_compiled_vs_generate']:.2f}x", ">= 2.0x"))
            if "decode_tok_s_hf_forward" in r:
                out.append((what + ", the engine on the transformers forward (before)", "bench_decode.py",
                            f"{r['decode_tok_s_hf_forward']:.1f}", base,
                            f"{r['decode_ratio_hf_forward_vs_generate']:.2f}x", ""))
        out.append((f"3-turn python conversation x{d['multiturn_conversations']}, wall s", "bench_decode.py",
                    f"{d['multiturn_s_engine']:.2f}", f"naive generate-per-turn {d['multiturn_s_naive']:.2f}",
                    f"{d['multiturn_ratio_vs_naive']:.2f}", "<= 0.5"))
    if "python_pool_p50_ms" in t:
        out.append(("python tool p50 ms", "bench_tools.py", f"{t['python_pool_p50_ms']:.1f} ({t['isolation']})",
                    f"cold `python -c` {t['cold_subprocess_p50_ms']:.1f}", f"{t['python_ratio']:.2f}", "<= 0.3"))
        out.append(("python tool, 8 threads, calls/s", "bench_tools.py", f"{t['python_concurrent_calls_per_s']:.1f}",
                    "", "", ""))
        out.append((f"BM25 p50 ms, HotpotQA corpus ({t['corpus_docs']} docs)", "bench_tools.py",
                    f"{t['bm25_p50_ms']:.2f} (p95 {t['bm25_p95_ms']:.2f})", "", "", "<= 2 ms"))
        out.append(("tool cache hit rate, 8 prompts x 16 samples", "bench_tools.py", f"{t['cache_hit_rate']:.2f}",
                    "", "", ""))
    if "packed_s" in tr:
        out.append((f"log-prob + backward, {tr['tree_shape']}", "bench_training.py",
                    f"packed {tr['packed_s']:.1f} s ({tr['tokens_packed']} tokens)",
                    f"flat {tr['flat_s']:.1f} s ({tr['tokens_flat']} tokens)", f"{tr['packed_over_flat']:.2f}",
                    "<= 0.6"))
    if "packed_dense_s" in tr:
        out.append((f"log-prob + backward, packed, block-sparse tree attention vs dense SDPA, {tr['tree_shape']}",
                    "bench_training.py", f"block-sparse {tr['packed_s']:.1f} s", f"dense {tr['packed_dense_s']:.1f} s",
                    f"{tr['packed_over_packed_dense']:.2f}", ""))
    if "chunked_peak_gb" in tr:
        out.append((f"peak RSS GB, {tr['memory_batch']}: chunked log-probs, one forward", "bench_training.py",
                    f"chunked {tr['chunked_peak_gb']:.2f}", f"naive {tr['naive_peak_gb']:.2f}",
                    f"{tr['chunked_over_naive_peak']:.2f}", "<= 0.5"))
    if "arpo_peak_gb" in tr:
        runs = tr.get("arpo_over_naive_peak_runs", [tr["arpo_over_naive_peak"]])
        arpo_runs = tr.get("arpo_peak_gb_runs", [tr["arpo_peak_gb"]])
        naive_runs = tr.get("naive_peak_gb_runs", [tr["naive_peak_gb"]])
        out.append((f"peak RSS GB, {tr['memory_batch']}: arpo's step (chunked + 1024-token micro-batches), "
                    f"{len(runs)} fresh-process runs", "bench_training.py",
                    "arpo " + " / ".join(f"{x:.2f}" for x in arpo_runs),
                    "naive " + " / ".join(f"{x:.2f}" for x in naive_runs),
                    f"max {max(runs):.2f} (" + " / ".join(f"{x:.2f}" for x in runs) + ")", "<= 0.5 every run"))
    rl = res.get("trl", {})
    what = "one full RL step (rollout, rewards, advantages, log-probs, loss/backward, AdamW)"
    if "ratio" in rl:
        st, ar, tr = rl["settings"], rl["arpo"], rl["trl"]
        out.append((f"{what}, {st['prompts']} GSM8K prompts x G={st['group_size']}, <= "
                    f"{st['max_completion_length']} tokens, no tools (TRL cannot express arpo's tool rollout), "
                    f"{st['threads']} torch thread(s), s", "bench_trl.py",
                    f"GRPO preset {ar['step_s']:.1f} (gen {ar['generation_s']:.1f} / train {ar['training_s']:.1f})",
                    f"TRL {st['trl']} GRPOTrainer {tr['step_s']:.1f} (gen {tr['generation_s']:.1f} / "
                    f"train {tr['training_s']:.1f})", f"{rl['ratio']:.2f}", "<= 0.5"))
    elif "skipped" in rl:
        out.append((what + " vs TRL GRPOTrainer", "bench_trl.py", "skipped", rl["skipped"], "", "<= 0.5"))
    ex = res.get("experiment", {})
    if "summary" in ex:  # read from the experiment's results.json (not run here: ~25 min)
        sm, st = ex["summary"], ex["settings"]
        lv = sm.get("ratio_levels", {}).get("1.00", {})
        calls = (f"ARPO {lv['calls_arpo']:.0f} calls" if lv.get("calls_arpo") is not None else "ARPO never")
        base = (f"GRPO {lv['calls_grpo']:.0f} calls" if lv.get("calls_grpo") is not None else "GRPO never")
        ratio = f"{sm['tool_call_ratio']:.2f}" if sm.get("tool_call_ratio") is not None else "n/a (no gain over SFT)"
        out.append((f"ARPO vs GRPO: training tool calls to reach task-set accuracy {sm.get('target_accuracy', 0):.3f} "
                    f"(SFT start {sm['start_accuracy']:.3f}), {st['seeds']} seeds, {st['steps']} steps",
                    "arpo experiment arpo-vs-grpo", calls, base, ratio, "paper: ~0.5"))
    return out


NOTES_MARK = "<!-- analysis: kept by run_all.py -->"
TRL_SKIP = "trl is not installed (benchmark-only dependency: pip install 'arpo[bench]')"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--skip", default="", help="comma-separated: decode, tools, rollout, training, trl")
    ap.add_argument("--out", default=str(HERE.parent / "BENCHMARKS.md"))
    ap.add_argument("--experiment", default=str(HERE.parent / "runs/experiments/arpo_vs_grpo/results.json"),
                    help="results.json of `arpo experiment arpo-vs-grpo` to include (read, not re-run)")
    a = ap.parse_args()
    skip = set(a.skip.split(","))
    reps = ["--repeats", "1" if a.quick else "3"]
    res = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
           "date": time.strftime("%Y-%m-%d")}
    if "decode" not in skip:
        res["decode"] = run("bench_decode.py", reps)
    if "tools" not in skip:
        res["tools"] = run("bench_tools.py", [])
    if "rollout" not in skip:
        res["rollout"] = run("bench_rollout.py", [])
    if "training" not in skip:
        res["training"] = run("bench_training.py", ["--repeats", "1" if a.quick else "2"])
    if "trl" not in skip:  # one RL step vs TRL's GRPOTrainer; trl is optional (the `bench` extra)
        if importlib.util.find_spec("trl") is None:
            res["trl"] = {"skipped": TRL_SKIP}
        else:
            res["trl"] = run("bench_trl.py", ["--quick"] if a.quick else ["--repeats", "3"])
    if Path(a.experiment).is_file():
        ex = json.loads(Path(a.experiment).read_text())
        res["experiment"] = {"file": a.experiment, "settings": ex["settings"], "wall_seconds": ex.get("wall_seconds"),
                             "summary": {k: v for k, v in ex["summary"].items() if k != "curves"}}
    lines = ["# Benchmarks", "",
             f"Written by `python benchmarks/run_all.py{' --quick' if a.quick else ''}` on {res['date']} "
             f"({res['machine']}); every comparison is measured side by side in one run, "
             + ("one measured repeat each (--quick)." if a.quick else "median of the repeats.")
             + " Re-run it to reproduce.",
             "",
             "| what | how | arpo | baseline | ratio | goal |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows(res)]
    errs = [f"- {k}: failed: `{v['error'].strip().splitlines()[-1]}`" for k, v in res.items()
            if isinstance(v, dict) and "error" in v]
    errs += [f"- {k}: skipped: {v['skipped']}" for k, v in res.items() if isinstance(v, dict) and "skipped" in v]
    lines += ([""] + errs if errs else []) + ["", "Raw numbers:", "", "```json", json.dumps(res, indent=1), "```", ""]
    # a hand-written analysis below NOTES_MARK in the existing file (profiles, reruns) is kept
    notes = ""
    if Path(a.out).is_file() and NOTES_MARK in Path(a.out).read_text():
        notes = Path(a.out).read_text().split(NOTES_MARK, 1)[1]
    Path(a.out).write_text("\n".join(lines) + ("\n" + NOTES_MARK + notes if notes else ""))
    print(json.dumps(res) if a.json else "\n".join(lines[:8 + len(rows(res))]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
