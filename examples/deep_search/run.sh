#!/usr/bin/env bash
# Deep search on CPU, offline, end to end: the local web (`arpo web serve`, the built-in HotpotQA
# corpus as HTML pages + SearXNG's JSON search API) -> worked trajectories made through the real
# web_search and browse tools -> SFT of the embedded SmolLM2-135M -> eval -> 2 ARPO steps -> eval.
# Everything lands in runs/deep_search/. ARPO_WEB_PORT picks another port (default 8090).
set -euo pipefail
cd "$(dirname "$0")/../.."
A=".venv/bin/arpo"
PY=".venv/bin/python"
Q=runs/deep_search
PORT="${ARPO_WEB_PORT:-8090}"
URL="http://127.0.0.1:$PORT"
# small results everywhere (SFT data, RL, eval): the top result's 200 characters, 300-character page
# windows, so that two searches and two pages fit the 135M model's short budget
WEB=(--web-url "$URL" --web-top-k 1 --web-snippet-chars 200 --browse-window-chars 300)
mkdir -p "$Q"

$A web serve --port "$PORT" > "$Q/web.log" 2>&1 &
WEB_PID=$!
trap 'kill "$WEB_PID" 2>/dev/null || true' EXIT
$PY - "$URL" <<'PY'      # wait until the local web answers (the first start builds the index, ~10 s)
import sys, time, httpx
for _ in range(600):
    try:
        if httpx.get(sys.argv[1] + "/health", timeout=1).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        time.sleep(0.5)
sys.exit("the local web did not start: see runs/deep_search/web.log")
PY

$A web sft-data --data hotpotqa:train --limit 48 "${WEB[@]}" --out "$Q/sft.jsonl" --quiet
$A sft --config examples/deep_search/sft.yaml --overwrite --quiet
# the RL task set: 2 HotpotQA training questions that are not in the SFT data
$PY - <<'PY'
import json
from arpo.data.datasets import load_examples
rows = load_examples("hotpotqa:train[300:302]")
open("runs/deep_search/rl_tasks.jsonl", "w").write("".join(json.dumps(r) + "\n" for r in rows))
PY
EVAL=(--data hotpotqa:dev --limit 8 --tools web_search,browse "${WEB[@]}" --max-tool-calls 4
      --max-response-tokens 768 --quiet)
$A eval --model "$Q/sft" "${EVAL[@]}" --out "$Q/eval_sft.json"
$A train --config examples/deep_search/train.yaml "tools.web.url=$URL" --overwrite --quiet
$A eval --model "$Q/arpo" "${EVAL[@]}" --out "$Q/eval_arpo.json"
$A compare sft="$Q/eval_sft.json" arpo="$Q/eval_arpo.json"
