"""Forking a python session vs re-running the trajectory's earlier calls (issue 19).

A trajectory's session holds ~100 MB of state built by its earlier calls (an array, a dict of
strings, an imported module). ARPO branches it after a tool result. Side by side:

* fork: `PythonSessionTool.fork` (a copy-on-write fork of the state process after that call, plus a
  copy of its working directory), then the branch's next call;
* replay: what a stateless tool (or a session tool without fork) must do: a fresh session that
  re-runs the earlier calls, then the next call.

    python benchmarks/bench_sessions.py [--mb 100] [--calls 3] [--repeats 5] [--json]
"""

import argparse
import json
import statistics
import time

from arpo.tools.python_session import PythonSessionTool


def earlier_calls(mb: int, n: int) -> list[str]:
    calls = [f"import numpy as np\nstate = np.random.rand({mb} * 2**20 // 8 // {n})"]
    calls += [f"state = np.concatenate([state, np.random.rand({mb} * 2**20 // 8 // {n})])" for _ in range(n - 1)]
    return calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=100, help="state size built by the earlier calls")
    ap.add_argument("--calls", type=int, default=3, help="earlier calls of the trajectory")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    nxt = "print(round(float(state.mean()), 2), state.nbytes // 2**20)"
    t = PythonSessionTool(timeout_s=60, memory_mb=4 * a.mb + 512, max_sessions=8)
    fork_s, replay_s = [], []
    try:
        for r in range(a.repeats):
            for c in earlier_calls(a.mb, a.calls):
                assert t.run_session(f"p{r}", c).ok
            t0 = time.perf_counter()
            t.fork(f"p{r}", f"b{r}", a.calls)
            out = t.run_session(f"b{r}", nxt)
            fork_s.append(time.perf_counter() - t0)
            assert out.ok, out.output
            t.end(f"b{r}")
            t0 = time.perf_counter()
            for c in earlier_calls(a.mb, a.calls):
                assert t.run_session(f"q{r}", c).ok
            out = t.run_session(f"q{r}", nxt)
            replay_s.append(time.perf_counter() - t0)
            t.end(f"q{r}")
            t.end(f"p{r}")
    finally:
        t.close()
    res = {"state_mb": a.mb, "earlier_calls": a.calls, "fork_then_call_ms": round(1000 * statistics.median(fork_s), 1),
           "replay_then_call_ms": round(1000 * statistics.median(replay_s), 1)}
    res["ratio"] = round(res["fork_then_call_ms"] / res["replay_then_call_ms"], 3)
    print(json.dumps(res) if a.json else json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
