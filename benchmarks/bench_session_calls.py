"""Latency of trivial calls in one python session, this tree against an earlier commit (issue 27 item 3).

    python benchmarks/bench_session_calls.py --base 316758a [--base de74316] [--rounds 2] [--calls 60] [--gap 0]

Each round runs, in a fresh process per tree (bases first, as bench_sandbox_ab.py does), `calls`
calls of `x = i; print(x)` through `PythonSessionTool.run_session` in one session and prints the
p50 / p90 of all but the first call. `--gap S`: a pause of S seconds after each call (the model
generating the next one; 0: back to back).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_sandbox_ab import ROOT, export_src

PROBE = """
import json, statistics, time
from arpo.tools.python_session import PythonSessionTool
t, ts = PythonSessionTool(), []
try:
    for i in range({n} + 1):
        t0 = time.perf_counter()
        r = t.run_session("s1", f"x = {{i}}\\nprint(x)")
        ts.append(time.perf_counter() - t0)
        assert r.ok and r.output.strip() == str(i), r.output
        time.sleep({gap})
finally:
    t.close()
ts = sorted(ts[1:])
p50, p90 = statistics.median(ts), ts[int(0.9 * len(ts))]
print(json.dumps({{"p50_ms": round(1000 * p50, 2), "p90_ms": round(1000 * p90, 2)}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, action="append", help="a commit to compare with (repeatable)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--gap", type=float, default=0.0, help="seconds between calls (the model generating)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for i, b in enumerate(a.base):
            (Path(tmp) / str(i)).mkdir()
            trees[f"base {b}"] = export_src(b, Path(tmp) / str(i))
        trees["this tree"] = ROOT / "src"
        for r in range(a.rounds):
            for name, src in trees.items():
                env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
                probe = PROBE.format(n=a.calls, gap=a.gap)
                out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                                     text=True, timeout=600, check=True).stdout.strip().splitlines()[-1]
                print(f"round {r + 1}  {name:<20} {out}")


if __name__ == "__main__":
    main()
