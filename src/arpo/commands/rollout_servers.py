"""`arpo rollout-servers`: start the stock vLLM OpenAI servers that `engine: vllm_server` rolls out on
(docs/vllm_backend.md, "Starting servers"), print the `rollout.servers` to use, stop them on Ctrl-C."""

from __future__ import annotations

from arpo.commands import HELP, POS_INT, number

EXAMPLES = """examples:
  arpo rollout-servers --model Qwen/Qwen2.5-7B-Instruct-dir --count 4 --gpus 0,1,2,3 --port 8000
  arpo rollout-servers --model runs/sft/final --python .venv-vllm/bin/python --max-model-len 4096 --dry-run
  arpo rollout-servers --model DIR --count 8 --gpus 0,1,2,3,4,5,6,7 --transfer ipc --gpu-memory-utilization 0.35

Each server is `python -m vllm.entrypoints.openai.api_server --model DIR ...` with VLLM_SERVER_DEV_MODE=1
(the weight-sync routes); then train with engine=vllm_server 'rollout.servers=[...]' as printed."""


def register(sub) -> None:
    p = sub.add_parser("rollout-servers", help="start vLLM servers for engine vllm_server",
                       description="Start COUNT stock vLLM OpenAI servers (ports PORT, PORT+1, ...) for "
                       "`engine: vllm_server`, print their rollout.servers line and wait; Ctrl-C stops them.",
                       epilog=EXAMPLES, formatter_class=HELP)
    p.add_argument("--model", required=True, help="the model directory the policy starts from (model.name)")
    p.add_argument("--count", type=POS_INT, default=1, help="servers to start")
    p.add_argument("--port", type=number(int, 1, 65535), default=8000, help="port of the first server")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for other nodes)")
    p.add_argument("--gpus", default=None,
                   help="comma-separated CUDA devices, one group per server: '0,1,2,3' or with "
                   "--tensor-parallel-size 2 '0+1,2+3'")
    p.add_argument("--tensor-parallel-size", type=POS_INT, default=1, help="GPUs per server")
    p.add_argument("--python", default=None, help="python of vLLM's environment (default: this one)")
    p.add_argument("--dtype", default="auto", help="serving dtype (auto, bfloat16, float32)")
    p.add_argument("--max-model-len", type=POS_INT, default=None, help="context length of the servers")
    p.add_argument("--enforce-eager", action="store_true", help="no compilation / CUDA graphs (faster start; CPU)")
    p.add_argument("--kv-cache-gib", type=float, default=None, help="CPU only: KV cache GiB per server")
    p.add_argument("--transfer", choices=("disk", "nccl", "ipc"), default="disk",
                   help="the weight push the trainer uses (engine_options.transfer): nccl / ipc add "
                   "--weight-transfer-config, ipc also VLLM_ALLOW_INSECURE_SERIALIZATION=1")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="vLLM's share of each GPU (leave the trainer its part when they share GPUs, as IPC does)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the command lines, start nothing (nor check --model and vLLM here)")
    p.set_defaults(func=run)


def plan(args) -> list[tuple[dict, list[str]]]:
    """(extra environment, command line) per server."""
    from arpo.engine.vllm_server import server_command, server_env
    from arpo.errors import ArpoError

    gpus = args.gpus.split(",") if args.gpus else None
    if gpus is not None and len(gpus) != args.count:
        raise ArpoError(f"--gpus: {len(gpus)} groups for --count {args.count} servers")
    out = []
    for i in range(args.count):
        env = server_env(args.kv_cache_gib, transfer=args.transfer)
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus[i].replace("+", ",")
        out.append((env, server_command(args.model, args.port + i, host=args.host, python=args.python,
                                        max_model_len=args.max_model_len, dtype=args.dtype,
                                        tensor_parallel_size=args.tensor_parallel_size,
                                        enforce_eager=args.enforce_eager, transfer=args.transfer,
                                        gpu_memory_utilization=args.gpu_memory_utilization)))
    return out


def check_start(args) -> None:
    """Before any server starts: --model is a model folder and vLLM imports in --python's environment
    (each server died on its own, minutes later, in vLLM's log)."""
    import subprocess
    import sys
    from pathlib import Path

    from arpo.engine.vllm import INSTALL_HINT
    from arpo.errors import ArpoError

    model = Path(args.model).expanduser()
    if not (model / "config.json").is_file():
        raise ArpoError(f"--model {args.model}: not a model folder (no config.json there); give the directory of "
                        "the weights the policy starts from (model.name, e.g. runs/sft/final/model)")
    py = args.python or sys.executable
    try:
        probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
        ok = subprocess.run([py, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except OSError as e:
        raise ArpoError(f"--python {py}: cannot run it ({e.strerror or e})") from None
    if not ok:
        raise ArpoError(f"--python {py}: {INSTALL_HINT}; or --python the python of an environment with vLLM")


def run(args) -> int:
    import os
    import shlex
    import subprocess
    import time

    servers = plan(args)
    if not args.dry_run:
        check_start(args)
    urls = [f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port + i}"
            for i in range(args.count)]
    for env, cmd in servers:
        print(" ".join(f"{k}={v}" for k, v in env.items()), shlex.join(cmd))
    print(f"rollout.servers=[{', '.join(urls)}]")
    if args.dry_run:
        return 0
    procs = [subprocess.Popen(cmd, env=dict(os.environ, **env)) for env, cmd in servers]
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(1)
        return next(p.returncode for p in procs if p.poll() is not None) or 1
    except KeyboardInterrupt:
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
