#!/usr/bin/env bash
# issue 40 trial: the example with a 6-step SFT (steps=6) on the copied-line data, everything else as run.sh
# (run from the repository root at commit b8e3153; the SFT data is the file run.sh wrote: `arpo web sft-data`, identical for every run)
set -euo pipefail
cd /work/main
A=.venv/bin/arpo
Q=runs/ds6
mkdir -p $Q
cp /work/ex40/repo/runs/deep_search/sft.jsonl $Q/sft.jsonl
PORT=8090; URL=http://127.0.0.1:$PORT
WEB=(--web-url "$URL" --web-top-k 2 --web-snippet-chars 30 --browse-window-chars 120)
$A web serve --corpus webhop:pages --port $PORT > $Q/web.log 2>&1 &
WP=$!; trap 'kill $WP' EXIT
sleep 15
SECONDS=0
$A sft --config examples/deep_search/sft.yaml "data.path=[$Q/sft.jsonl]" run.dir=$Q/sft steps=6 --overwrite --quiet
echo "[ds6] sft $SECONDS"
EVAL=(--data webhop:dev webhop:test --template webhop --tools web_search,browse "${WEB[@]}" --max-tool-calls 5
      --max-response-tokens 576 --batch-size 30 --quiet)
$A eval --model $Q/sft "${EVAL[@]}" --out $Q/eval_sft.json
echo "[ds6] eval sft $SECONDS"
.venv/bin/python -c "
import json,sys
r=json.load(open('$Q/eval_sft.json'))['results']; a=[v['pass@1'] for v in r.values()]
print('[ds6] sft pass@1', a); sys.exit(0 if max(a) < 0.8 else 3)" || { echo "[ds6] start too strong: no RL"; exit 0; }
$A train --config examples/deep_search/train.yaml model.name=$Q/sft run.dir=$Q/arpo "tools.web.url=$URL" --overwrite --quiet
echo "[ds6] arpo $SECONDS"
$A eval --model $Q/arpo "${EVAL[@]}" --out $Q/eval_arpo.json
$A compare sft=$Q/eval_sft.json arpo=$Q/eval_arpo.json --out $Q/compare.json
echo "[ds6] done $SECONDS"
