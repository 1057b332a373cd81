"""verifiers environments (verifiers 0.4.0, its `verifiers.v1` stack) behind a process boundary.

verifiers pins mcp 2.0.0, openai<3 and more that clash with arpo's, so it lives in its own venv
(`.venv-verifiers`, scripts/install_verifiers.sh) and runs there as a worker process
(envs/verifiers_worker.py, JSON lines on stdin/stdout), one per taskset and config per arpo run:

    vf:TASKSET?n=64&skip=0&KEY=VALUE     data: tasks skip..skip+n of the taskset (a module exporting its
                                         vf.Taskset in __all__, importable from the directory arpo runs
                                         in); `timeout_s` bounds each request to the worker (default
                                         300); other keys are the taskset config's fields (JSON values)
    tools.enabled: ["vf:TASKSET"]        the tasks' vf.Toolset tools, as verifiers names them
                                         (`<server>_<tool>`, their MCP schemas)
    reward.fn: vf                        the task's own rubric: Task.score(trace) (its @vf.reward
                                         functions, weighted, and @vf.metric / judges)

A row's question is the task's system prompt and prompt; `vf: {taskset, config, idx, prompt}` tells the
tool and the reward which task a trajectory plays. The tools' shared rollout state (vf.State) rides
on each call record (`meta.vf_state`), so a fork continues from the state after its last inherited
call and the reward sees the final state. The reward rebuilds the conversation (prompt, the model's
turns with their tool calls, the tool results) as a vf.Trace and the step's metrics get the mean of
each reward function and metric (`vf/NAME`).

The tools are tools/plugins/verifiers.py, the reward `vf` rewards/env.py.
`ARPO_VERIFIERS_PYTHON` names another python to run the worker with (default: .venv-verifiers/bin/python
in the directory arpo runs in, else in arpo's checkout).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from arpo.errors import ArpoError
from arpo.spec_query import query_pairs

PYTHON_ENV = "ARPO_VERIFIERS_PYTHON"
VENV = ".venv-verifiers"
WORKER = Path(__file__).with_name("verifiers_worker.py")
DEFAULT_N = 64
DEFAULT_TIMEOUT_S = 300.0  # one request (loading the taskset, a tool call, a score)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse(spec: str) -> tuple[str, int, int, dict]:
    """'vf:my_env?n=8&skip=100&difficulty=2' -> ('my_env', 8, 100, {'difficulty': 2}); `timeout_s` stays
    in the config dict (worker() takes it out)."""
    name, _, query = spec.removeprefix("vf:").partition("?")
    opts = {k: _value(v) for k, v in query_pairs(query)}
    n, skip = opts.pop("n", DEFAULT_N), opts.pop("skip", 0)
    timeout = opts.get("timeout_s", DEFAULT_TIMEOUT_S)
    if not name or not isinstance(n, int) or not isinstance(skip, int) or n < 1 or skip < 0 \
            or isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ArpoError(f"{spec}: expected vf:TASKSET[?n=N&skip=K&timeout_s=S&KEY=VALUE...] with integers n >= 1 and "
                        "skip >= 0 and a number timeout_s > 0 (e.g. vf:my_env?n=64)")
    return name, n, skip, opts


def verifiers_python() -> str:
    """The python of verifiers' venv; a one-line error naming the install script when there is none."""
    if os.environ.get(PYTHON_ENV):
        if not Path(os.environ[PYTHON_ENV]).exists():
            raise ArpoError(f"vf: {PYTHON_ENV}={os.environ[PYTHON_ENV]} does not exist; run "
                            "scripts/install_verifiers.sh (it makes .venv-verifiers) or point it at that venv's python")
        return os.environ[PYTHON_ENV]
    for root in (Path.cwd(), Path(__file__).resolve().parents[3]):
        py = root / VENV / "bin" / "python"
        if py.exists():
            return str(py)
    raise ArpoError(f"vf: environments run in verifiers' own venv, and there is none ({VENV}/bin/python is missing "
                    f"here and in arpo's checkout): run scripts/install_verifiers.sh (or set {PYTHON_ENV})")


class VerifiersWorker:
    """One worker process playing one taskset (module docstring); requests are serialized."""

    def __init__(self, taskset: str, config: dict, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.taskset, self.config, self.timeout_s = taskset, dict(config), timeout_s
        self.name = f"verifiers environment {taskset}"
        self._lock = threading.Lock()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - the worker writes its stderr to it while it lives
        env = dict(os.environ, PYTHONPATH=os.getcwd(), PYTHONUNBUFFERED="1")
        python = verifiers_python()
        try:
            self.proc = subprocess.Popen([python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._log, env=env, text=True)
        except OSError as e:
            raise ArpoError(f"cannot start the {self.name} worker with {python} ({e}); run "
                            "scripts/install_verifiers.sh") from e
        atexit.register(self.close)
        self.request("load", taskset=taskset, config=self.config)

    def request(self, op: str, **args: Any) -> dict:
        with self._lock:
            if self.proc.poll() is None:
                try:
                    assert self.proc.stdin is not None and self.proc.stdout is not None
                    self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
                    self.proc.stdin.flush()
                    # one reply line per request: nothing is left buffered between requests
                    ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout_s)
                    line = self.proc.stdout.readline() if ready else None
                except (OSError, ValueError):
                    line = ""
            else:
                line = ""
        if line is None:
            self.close()
            raise ArpoError(f"the {self.name} worker did not answer {op} within {self.timeout_s:g} s (stopped it); "
                            "raise timeout_s in the vf: spec if its tools or rubric are slow")
        if not line:
            self.proc.wait(10)
            raise ArpoError(f"the {self.name} worker exited with status {self.proc.returncode} ({op}): "
                            f"{self._tail() or 'no output'}")
        try:
            reply = json.loads(line)
        except ValueError as e:
            raise ArpoError(f"the {self.name} worker answered {op} with malformed JSON ({line[:80]!r})") from e
        if "error" in reply:
            raise ArpoError(f"{self.name}: {op} failed: {reply['error']}")
        return reply

    def _tail(self) -> str:
        self._log.seek(0)
        lines = [x.strip() for x in self._log.read().decode(errors="replace").splitlines() if x.strip()]
        return lines[-1][:300] if lines else ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_WORKERS: dict[str, VerifiersWorker] = {}
_WORKERS_LOCK = threading.Lock()


def worker(taskset: str, config: dict) -> VerifiersWorker:
    """The run's worker for a taskset and config (data, tools and reward share it); `timeout_s` in the
    config is arpo's (each request's limit), not the taskset's."""
    cfg = dict(config)
    timeout_s = float(cfg.pop("timeout_s", DEFAULT_TIMEOUT_S))
    key = json.dumps([taskset, cfg], sort_keys=True)
    with _WORKERS_LOCK:
        if key not in _WORKERS or _WORKERS[key].proc.poll() is not None:
            _WORKERS[key] = VerifiersWorker(taskset, cfg, timeout_s)
        return _WORKERS[key]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n\n".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


# ---- data ---------------------------------------------------------------------------------------------
def iter_rows(spec: str):
    taskset, n, skip, config = parse(spec)
    for t in worker(taskset, config).request("tasks", n=n, skip=skip)["tasks"]:
        parts = [t["system"]] if t.get("system") else []
        parts += [_text(m.get("content")) for m in t["prompt"] if m.get("role") in ("system", "user")]
        answer = t["data"].get("answer")
        yield f"{spec} task {t['idx']}", {
            "id": f"vf:{taskset}#{t['idx']}", "question": "\n\n".join(p for p in parts if p),
            "answers": [str(answer) if answer not in (None, "") else "-"], "task": "qa",
            "vf": {"taskset": taskset, "config": config, "idx": t["idx"], "system": t.get("system"),
                   "prompt": t["prompt"]}}


# ---- the conversation the rubric reads -------------------------------------------------------------------------
def _meta(call: Any) -> dict:
    m = call.get("meta") if isinstance(call, dict) else getattr(call, "meta", None)
    return m if isinstance(m, dict) else {}


def messages(response: str, vf: dict, tool_calls: list | None, tool_spans: list | None) -> tuple[list[dict], Any]:
    """The conversation as verifiers reads it (system, prompt, the model's turns with their tool calls,
    the tool results: the text between and in `tool_spans`, the spans matched to the call records in
    order) and the rollout State after the last call that returned one."""
    out: list[dict] = [{"role": "system", "content": vf["system"]}] if vf.get("system") else []
    out += [dict(m, sampled=False) if m.get("role") == "assistant" else dict(m) for m in vf["prompt"]]
    records = list(tool_calls or [])
    metas = [_meta(c) for c in records]
    for m in metas:
        if m.get("vf_error"):
            raise ArpoError(m["vf_error"])
    states = [m["vf_state"] for m in metas if "vf_state" in m]
    spans = sorted(tool_spans or [])
    pos = 0
    for i, (a, b) in enumerate(spans):
        meta = metas[i] if len(metas) == len(spans) else {}
        turn: dict = {"role": "assistant", "content": response[pos:a]}
        if "vf_args" in meta:
            rec = records[i]
            name = rec.get("tool") if isinstance(rec, dict) else getattr(rec, "tool", "tool")
            turn["tool_calls"] = [{"id": f"call_{i}", "name": name, "arguments": json.dumps(meta["vf_args"])}]
            out += [turn, {"role": "tool", "tool_call_id": f"call_{i}", "name": name, "content": response[a:b]}]
        else:  # a call that reached no tool (malformed, refused): its error is what the model read
            out += [turn, {"role": "user", "content": response[a:b]}]
        pos = b
    out.append({"role": "assistant", "content": response[pos:]})
    return out, states[-1] if states else None


def score(vf: dict, msgs: list[dict], state: Any) -> dict:
    """The task's rubric on the conversation: {reward, rewards: {name: [score, weight]}, metrics}."""
    return worker(vf["taskset"], vf.get("config") or {}).request("score", idx=vf["idx"], messages=msgs, state=state)
