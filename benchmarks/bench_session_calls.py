"""Latency of trivial calls in one python session, this tree against an earlier commit (issue 27 item 3).

    python benchmarks/bench_session_calls.py --base 316758a [--rounds 2] [--calls 60]

Each round runs, in a fresh process per tree (base first, as bench_sandbox_ab.py does), `calls`
calls of `x = i; print(x)` through `PythonSessionTool.run_session` in one session and prints the
p50 / p90 of all but the first call.
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
finally:
    t.close()
ts = sorted(ts[1:])
p50, p90 = statistics.median(ts), ts[int(0.9 * len(ts))]
print(json.dumps({{"p50_ms": round(1000 * p50, 2), "p90_ms": round(1000 * p90, 2)}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the commit to compare with")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--calls", type=int, default=60)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {f"base {a.base}": export_src(a.base, Path(tmp)), "this tree": ROOT / "src"}
        for r in range(a.rounds):
            for name, src in trees.items():
                env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
                out = subprocess.run([sys.executable, "-c", PROBE.format(n=a.calls)], env=env, capture_output=True,
                                     text=True, timeout=600, check=True).stdout.strip().splitlines()[-1]
                print(f"round {r + 1}  {name:<20} {out}")


if __name__ == "__main__":
    main()
