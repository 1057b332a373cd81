#!/usr/bin/env bash
# issue 40 trial: ARPO from the 6-step SFT model with rollouts at T 0.7 (everything else as train.yaml)
set -euo pipefail
cd /work/main
A=.venv/bin/arpo
Q=runs/ds6
PORT=8090; URL=http://127.0.0.1:$PORT
WEB=(--web-url "$URL" --web-top-k 2 --web-snippet-chars 30 --browse-window-chars 120)
$A web serve --corpus webhop:pages --port $PORT > $Q/web_t.log 2>&1 &
WP=$!; trap 'kill $WP' EXIT
sleep 15
SECONDS=0
$A train --config examples/deep_search/train.yaml model.name=$Q/sft run.dir=$Q/arpo_t07 agent.temperature=0.7 "tools.web.url=$URL" --overwrite --quiet
echo "[ds6t] arpo $SECONDS"
EVAL=(--data webhop:dev webhop:test --template webhop --tools web_search,browse "${WEB[@]}" --max-tool-calls 5
      --max-response-tokens 576 --batch-size 30 --quiet)
$A eval --model $Q/arpo_t07 "${EVAL[@]}" --out $Q/eval_arpo_t07.json
$A compare sft=$Q/eval_sft.json arpo_t07=$Q/eval_arpo_t07.json --out $Q/compare_t07.json
echo "[ds6t] done $SECONDS"
