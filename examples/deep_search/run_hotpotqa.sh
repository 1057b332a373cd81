#!/usr/bin/env bash
# Deep search on CPU, offline, end to end: the local web (`arpo web serve`, the built-in HotpotQA
# corpus as HTML pages + SearXNG's JSON search API) -> worked trajectories made through the real
# web_search and browse tools -> SFT of the embedded SmolLM2-135M -> eval -> 2 ARPO steps -> eval.
# Both evals are also scored by an LLM judge (`arpo eval --judge`, the paper's equivalence prompt):
# the embedded model itself behind `arpo serve agent` with no tools, an OpenAI-compatible endpoint
# on localhost (a 135M judge: its verdicts show the plumbing, not a trustworthy accuracy).
# Everything lands in runs/deep_search_hotpotqa/. ARPO_WEB_PORT / ARPO_JUDGE_PORT pick other ports (8090 / 8091).
set -euo pipefail
cd "$(dirname "$0")/../.."
A=".venv/bin/arpo"
PY=".venv/bin/python"
Q=runs/deep_search_hotpotqa
PORT="${ARPO_WEB_PORT:-8090}"
URL="http://127.0.0.1:$PORT"
JPORT="${ARPO_JUDGE_PORT:-8091}"
JUDGE_URL="http://127.0.0.1:$JPORT"
# small results everywhere (SFT data, RL, eval): the top result's 200 characters, 300-character page
# windows, so that two searches and two pages fit the 135M model's short budget
WEB=(--web-url "$URL" --web-top-k 1 --web-snippet-chars 200 --browse-window-chars 300)
mkdir -p "$Q"

$A web serve --port "$PORT" > "$Q/web.log" 2>&1 &
WEB_PID=$!
$A serve agent --model smollm2-135m-instruct --served-model-name judge --tools none --device cpu \
    --port "$JPORT" --log-level warning > "$Q/judge.log" 2>&1 &
JUDGE_PID=$!
trap 'kill "$WEB_PID" "$JUDGE_PID" 2>/dev/null || true' EXIT
wait_for() {  # URL LOG: until URL/health answers (the local web's first start builds the index, ~10 s)
    $PY - "$1" "$2" <<'PY'
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
}
wait_for "$URL" "$Q/web.log"
wait_for "$JUDGE_URL" "$Q/judge.log"

$A web sft-data --data hotpotqa:train --limit 48 "${WEB[@]}" --out "$Q/sft.jsonl" --quiet
$A sft --config examples/deep_search/sft_hotpotqa.yaml --overwrite --quiet
# the RL task set: the last 2 HotpotQA training questions that are not in the SFT data
$PY examples/deep_search/rl_tasks.py "$Q/sft.jsonl" "$Q/rl_tasks.jsonl" --data hotpotqa:train -n 2
EVAL=(--data hotpotqa:dev --limit 6 --tools web_search,browse "${WEB[@]}" --max-tool-calls 4
      --max-response-tokens 768 --quiet
      --judge --judge-url "$JUDGE_URL/v1" --judge-model judge --judge-max-tokens 8)
$A eval --model "$Q/sft" "${EVAL[@]}" --out "$Q/eval_sft.json"
$A train --config examples/deep_search/train_hotpotqa.yaml "tools.web.url=$URL" --overwrite --quiet
$A eval --model "$Q/arpo" "${EVAL[@]}" --out "$Q/eval_arpo.json"
$A compare sft="$Q/eval_sft.json" arpo="$Q/eval_arpo.json"
