#!/usr/bin/env bash
# GPU check (docs/gpu_check.md): random-weight SmolLM2-135M and Qwen2.5-1.5B architectures in bf16,
# arpo's engine vs generate, ARPO RL steps with the python tool, packed vs flat training, vLLM if present.
#   benchmarks/gpu_check.sh [--device cuda|cpu] [--smoke] [--json OUT] [--models ...] [--skip-vllm]
# Killed (SIGTERM, then SIGKILL 15 s later) after 480 s; on SIGTERM it prints what it measured so far.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec timeout -k 15 480 "${PYTHON:-.venv/bin/python}" benchmarks/gpu_check.py "$@"
