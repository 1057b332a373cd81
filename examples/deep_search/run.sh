#!/usr/bin/env bash
# Deep search that learns on a CPU, offline, end to end, on the built-in webhop task (two dependent
# hops on a local web of 120 fictional pages; src/arpo/data/builtin/webhop/DATASHEET.md):
#   the local web (`arpo web serve --corpus webhop:pages`: HTML pages + SearXNG's JSON search API)
#   -> worked trajectories through the real web_search and browse tools (`arpo web sft-data`)
#   -> SFT of the embedded SmolLM2-135M -> eval -> ARPO -> eval -> `arpo compare` (paired wins/losses).
# Held-out: webhop:dev and webhop:test (60 + 60 questions whose first-hop towns no training question
# starts from), greedy. Everything lands in runs/deep_search/. ARPO_WEB_PORT picks another port (8090).
# The HotpotQA / paper-benchmark path (larger models): run_hotpotqa.sh and configs/gpu/deep_search_*.yaml.
set -euo pipefail
cd "$(dirname "$0")/../.."
A="${ARPO_BIN:-.venv/bin/arpo}"
PY="${ARPO_PYTHON:-.venv/bin/python}"
Q=runs/deep_search
PORT="${ARPO_WEB_PORT:-8090}"
URL="http://127.0.0.1:$PORT"
# the task's result sizes (arpo.data.webhop.WEB), the same for the SFT data, RL and eval
WEB=(--web-url "$URL" --web-top-k 2 --web-snippet-chars 30 --browse-window-chars 120)
mkdir -p "$Q"
SECONDS=0

$A web serve --corpus webhop:pages --port "$PORT" > "$Q/web.log" 2>&1 &
WEB_PID=$!
trap 'kill "$WEB_PID" 2>/dev/null || true' EXIT
$PY - "$URL" "$Q/web.log" <<'PY'
import sys, time, httpx
for _ in range(600):
    try:
        if httpx.get(sys.argv[1] + "/health", timeout=1).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(0.5)
sys.exit(f"{sys.argv[1]} did not start: see {sys.argv[2]}")
PY
stage() { echo "[deep_search] ${SECONDS} s: $*"; }

stage "worked trajectories"
$A web sft-data --data 'webhop:train[0:120]' "${WEB[@]}" --out "$Q/sft.jsonl" --quiet
stage "SFT"
$A sft --config examples/deep_search/sft.yaml --overwrite --quiet
EVAL=(--data webhop:dev webhop:test --template webhop --tools web_search,browse "${WEB[@]}" --max-tool-calls 6
      --max-response-tokens 832 --batch-size 30 --quiet)
stage "eval SFT"
$A eval --model "$Q/sft" "${EVAL[@]}" --out "$Q/eval_sft.json"
stage "ARPO"
$A train --config examples/deep_search/train.yaml "tools.web.url=$URL" --overwrite --quiet
stage "eval ARPO"
$A eval --model "$Q/arpo" "${EVAL[@]}" --out "$Q/eval_arpo.json"
$A compare sft="$Q/eval_sft.json" arpo="$Q/eval_arpo.json" --out "$Q/compare.json"
stage "done"
