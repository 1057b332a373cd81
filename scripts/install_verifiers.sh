#!/usr/bin/env bash
# Set up verifiers (the `vf:` environments, arpo.envs.verifiers) in its own venv, ./.venv-verifiers,
# next to the main ./.venv: verifiers 0.4.0 pins mcp==2.0.0, openai<3 and more that clash with arpo's
# pins, so arpo runs it as a worker process with this venv's python (docs/environments.md).
#
#   scripts/install_verifiers.sh                      # verifiers==0.4.0 from the package registry
#   ARPO_VERIFIERS_SPEC="verifiers[ta]==0.4.0" scripts/install_verifiers.sh   # with an extra
#
# Idempotent: a second run only checks what is there. Takes 1.5-3 min (100 distributions, mostly pure Python
# wheels) the first time. Your environments' own dependencies go into this venv too:
# .venv-verifiers/bin/python -m pip install ...  (arpo itself is not installed here: the worker,
# src/arpo/envs/verifiers_worker.py, imports only verifiers and the standard library).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ARPO_VERIFIERS_VENV:-.venv-verifiers}"
SPEC="${ARPO_VERIFIERS_SPEC:-verifiers==0.4.0}"
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# installed already: only its metadata is read here (importing verifiers takes seconds; the check below does once)
if ! "$VENV/bin/python" -m pip show -q verifiers >/dev/null 2>&1; then
  "$VENV/bin/python" -m pip install -q --upgrade "pip>=24" >/dev/null
  "$VENV/bin/python" -m pip install -q "$SPEC"
fi
"$VENV/bin/python" - <<'PY'
import sys
import verifiers, verifiers.v1, mcp.server.mcpserver  # noqa: F401 - what the worker imports
print(f"verifiers {verifiers.__version__} (mcp {__import__('importlib.metadata').metadata.version('mcp')}) in", sys.prefix)
PY
