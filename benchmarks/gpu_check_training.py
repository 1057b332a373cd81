"""The GPU check's training-side measurements (issue 60), called by benchmarks/gpu_check.py per model:

f. master: bf16 weights vs float32 master weights under AdamW at lr 1e-6 on the model's own weight
   tensors (same gradients, on the device): the fraction of the weights each moves in a few steps.
   bf16's spacing near 0.02 is 1.2e-4; an update is ~lr, so bf16 weights keep almost none of them.
g. memory: the peak of one training micro-batch (forward + backward + AdamW step) the way `arpo train`
   runs it in one process — float32 master weights, bf16 autocast, chunked log-probs — with and without
   activation checkpointing, against training/memory.py's estimate of the same terms (weights,
   gradients, AdamW, activations, head). CUDA only (on CPU the process's peak RSS cannot be reset: the
   estimate is reported, the measurement is None).
h. push (vLLM installed): a `vllm serve` server on this GPU (server_command/server_env with the IPC
   settings), the policy's weights perturbed and pushed through VLLMServerEngine (transfer ipc, then disk
   on the same server), a greedy continuation generated on the server and its recorded log-probs
   compared with the trainer's forward of the same tokens (a push that did not land shows up as a large
   difference: the perturbation moves the log-probs by far more than bf16 noise).
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def bench_master(model, dev, steps: int = 3, lr: float = 1e-6, max_elems: int = 64_000_000) -> dict:
    """AdamW on bf16 copies vs float32 copies of the model's weight tensors (the first ones up to
    max_elems elements), the same random gradients: the fraction of elements each changed."""
    import torch

    g = torch.Generator(device=dev.name if dev.cuda else "cpu").manual_seed(0)
    moved = {torch.bfloat16: 0, torch.float32: 0}
    n = 0
    for _name, p in model.named_parameters():
        if n + p.numel() > max_elems:  # (the big embedding of a smoke model would dwarf its layers)
            continue
        start = p.detach().to(torch.bfloat16)
        grads = [torch.randn(p.shape, generator=g, device=p.device) * 1e-3 for _ in range(steps)]
        for dt in moved:
            w = torch.nn.Parameter(start.to(dt).clone())
            opt = torch.optim.AdamW([w], lr=lr, weight_decay=0.01, foreach=False)
            for gr in grads:
                w.grad = gr.to(dt)
                opt.step()
            moved[dt] += int((w.detach() != start.to(dt)).sum())
            del w, opt
        n += start.numel()
        del grads, start
    dev.free()
    return {"steps": steps, "lr": lr, "elements": n, "bf16_moved_frac": moved[torch.bfloat16] / max(n, 1),
            "master_moved_frac": moved[torch.float32] / max(n, 1)}


def _trees(tokens: int, group: int, vocab: int, seed: int = 0) -> list[dict]:
    """One tree of `tokens` packed tokens: a prompt of a quarter, `group` responses sharing it."""
    r = random.Random(seed)
    prompt = tokens // 4
    resp = (tokens - prompt) // group
    ids = lambda k: [r.randrange(8, vocab) for _ in range(k)]  # noqa: E731 - a local helper
    return [{"prompt": ids(prompt), "responses": [ids(resp) for _ in range(group)], "parent": [-1] * group,
             "branch_at": [0] * group}]


def bench_memory(build, tokens: int, dev, group: int = 4) -> dict:
    """build() -> a fresh float32 model on the device. Without, then with checkpointing: the peak of one
    micro-batch of `tokens` tokens (bf16 autocast forward + backward, a fresh AdamW's step: its moments
    are allocated in it) above what was allocated before the model, vs the estimate."""
    import torch

    from arpo.training import memory as M
    from arpo.training.batch import TreeBatch, loss_and_backward
    from arpo.training.optim import autocast, checkpoint_activations

    out: dict = {"tokens": tokens, "unit": "GiB"}
    base = torch.cuda.memory_allocated() / M.GIB if dev.cuda else 0.0  # what else lives on the GPU
    model = build()
    a = M.arch_from_config(model.config)
    for ckpt in (False, True):
        if ckpt:
            checkpoint_activations(model)
        model.train()
        model.zero_grad(set_to_none=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=False)
        trees = _trees(tokens, group, min(model.config.vocab_size, 49152))
        batch = TreeBatch.from_trees(trees, TreeBatch.all_generated(trees)).to(next(model.parameters()).device)

        def loss_fn(lp, en, batch=batch):
            return -(lp * batch.mask).sum() / batch.mask.sum(), {}

        dev.reset_peak()
        t0 = time.perf_counter()
        with autocast(model, torch.bfloat16):
            loss_and_backward(model, batch, loss_fn, max_tokens=tokens, current=(torch.zeros(batch.mask.shape), None))
        opt.step()
        dev.sync()
        n = M.n_params(a)
        seq = M.micro_seq(tokens, tokens // 4, group, tokens, packed=True)
        terms = {"weights": M.weights_bytes(n, 4), "gradients": M.weights_bytes(n, 4),
                 "optimizer": M.adamw_bytes(n, 4), "activations": M.activation_bytes(a, tokens, seq, 2, ckpt),
                 "head": M.head_bytes(a, tokens, 2)}
        key = "checkpointing" if ckpt else "no_checkpointing"
        measured = dev.peak_gb() - base if dev.cuda else None
        est = sum(terms.values()) / M.GIB
        out[key] = {"step_s": time.perf_counter() - t0, "measured_gib": measured, "estimate_gib": est,
                    "estimate_over_measured": est / measured if measured else None,
                    "terms_gib": {k: v / M.GIB for k, v in terms.items()}}
        del opt, batch
        dev.free()
    del model
    dev.free()
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _greedy(eng, prompt: list[int], new: int):
    from arpo.engine.base import SamplingParams

    sid = eng.add(prompt, SamplingParams(temperature=0.0, max_len=len(prompt) + new))
    while eng.has_unfinished():
        eng.step()
    s = eng.seq(sid)
    out = (list(s.tokens[s.prompt_len:]), list(s.logprobs))
    eng.release(sid)
    return out


def _trainer_logprobs(model, prompt: list[int], resp: list[int]):
    import torch

    from arpo.training.batch import TreeBatch, token_logprobs

    trees = [{"prompt": prompt, "responses": [resp], "parent": [-1], "branch_at": [0]}]
    batch = TreeBatch.from_trees(trees, TreeBatch.all_generated(trees)).to(next(model.parameters()).device)
    with torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16):
        lp, _ = token_logprobs(model, batch)
    return lp[0, : len(resp)].float().cpu()


def bench_push(model, tok, dev, remaining_s: float, python: str | None = None, new: int = 16) -> dict:
    """A `vllm serve` server on this GPU started from the model (saved in bf16); for each transfer (ipc on
    CUDA, then disk): perturb the policy, push, generate greedily on the server, compare its log-probs
    with the trainer's forward of the same tokens. Returns per transfer: push seconds, max / mean |Δ|."""
    import httpx
    import torch

    from arpo.engine.vllm_server import VLLMServerEngine, server_command, server_env

    transfers = ["ipc", "disk"] if dev.cuda else ["disk"]
    work = Path(tempfile.mkdtemp(prefix="arpo-gpu-check-push-"))
    model.to(torch.bfloat16).save_pretrained(work / "model", safe_serialization=True)
    tok.save_pretrained(work / "model")
    model.float()
    port = _free_port()
    cmd = server_command(str(work / "model"), port, python=python, dtype="bfloat16", transfer=transfers[0],
                         gpu_memory_utilization=0.3 if dev.cuda else None, enforce_eager=True, max_model_len=2048)
    env = dict(os.environ, **server_env(kv_cache_gib=None if dev.cuda else 1, transfer=transfers[0]))
    log = open(work / "server.log", "w")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    res: dict = {"server_cmd": " ".join(cmd)}
    t0 = time.perf_counter()
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}: {(work / 'server.log').read_text()[-1500:]}")
            if time.perf_counter() - t0 > remaining_s:
                raise TimeoutError(f"server not up within {remaining_s:.0f} s (budget)")
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        res["server_start_s"] = time.perf_counter() - t0
        prompt = tok("Once upon a time there was a robot who learned")["input_ids"]
        for i, transfer in enumerate(transfers):
            with torch.no_grad():  # a perturbation the log-probs see far beyond bf16 noise
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.02, alpha=1.0)
            eng = VLLMServerEngine([url], tok, transfer=transfer, topk_entropy=1,
                                   weights_dir=str(work / f"w{i}"), push_timeout_s=max(30.0, remaining_s))
            try:
                t = time.perf_counter()
                eng.load_weights(model)
                push_s = time.perf_counter() - t
                resp, lps = _greedy(eng, prompt, new)
            finally:
                eng.close()
            ref = _trainer_logprobs(model, prompt, resp)
            d = (torch.tensor(lps) - ref).abs()
            res[transfer] = {"push_s": push_s, "tokens": len(resp), "max_abs_logp_diff": float(d.max()),
                             "mean_abs_logp_diff": float(d.mean()), "weight_version": eng.weight_version}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return res


if __name__ == "__main__":
    sys.exit("import this from benchmarks/gpu_check.py")
