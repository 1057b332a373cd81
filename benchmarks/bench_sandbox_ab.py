"""The python sandbox's cost against an earlier commit, side by side in one run (issue 27).

    python benchmarks/bench_sandbox_ab.py --base <commit> [--rounds 3] [--calls 100] [--json]

Exports `src/` of `--base` with `git archive` and runs `arpo.tools.python.benchmark()` of each tree in
a fresh process, alternating base and this tree for `--rounds` rounds, so that both see the same load.
Per tree: the trivial call's pool p50 (`print(1+1)` from a full, ready pool) and the sustained
4-thread throughput (calls/s), median over the rounds, plus every round's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = "import json, arpo.tools.python as p\nprint(json.dumps(p.benchmark({n})))"


def export_src(commit: str, dest: Path) -> Path:
    """`src/` of `commit`, unpacked under `dest`."""
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src"], capture_output=True, check=True).stdout
    tar = dest / "src.tar"
    tar.write_bytes(blob)
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="data")
    return dest / "src"


def one_round(src: Path, calls: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", PROBE.format(n=calls)], env=env, capture_output=True, text=True,
                         timeout=600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"benchmark of {src} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the commit to compare with (e.g. HEAD~7)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    base = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base], capture_output=True, text=True,
                          check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {f"base {base}": export_src(args.base, Path(tmp)), f"this tree ({head}+)": ROOT / "src"}
        rounds: dict[str, list[dict]] = {k: [] for k in trees}
        for _ in range(args.rounds):
            for name, src in trees.items():
                rounds[name].append(one_round(src, args.calls))
    summary = {name: {"pool_p50_ms": statistics.median(r["pool_p50_ms"] for r in rs),
                      "concurrent4_calls_per_s": statistics.median(r["concurrent4_calls_per_s"] for r in rs),
                      "rounds": [{k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()} for r in rs]}
               for name, rs in rounds.items()}
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        for name, s in summary.items():
            p50s = ", ".join(f"{r['pool_p50_ms']:.2f}" for r in s["rounds"])
            conc = ", ".join(f"{r['concurrent4_calls_per_s']:.1f}" for r in s["rounds"])
            print(f"{name:24s} p50 {s['pool_p50_ms']:.2f} ms ({p50s})   4-thread {s['concurrent4_calls_per_s']:.1f} "
                  f"calls/s ({conc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
