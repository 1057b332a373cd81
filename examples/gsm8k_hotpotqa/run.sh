#!/usr/bin/env bash
# The GSM8K + HotpotQA pipeline (the first quick start; the quick start is now SVAMP, ./quickstart.sh):
# cold-start SFT data -> SFT -> eval (before) -> a few ARPO steps -> eval (after), with the embedded
# SmolLM2-135M, real python and search tools, on CPU (~15 minutes on 2 cores). The protocol is
# learned (format errors 0.875 -> 0) but pass@1 stays 0.000 in this budget: GSM8K and HotpotQA are
# too hard for a 135M model in minutes. Everything lands in runs/gsm8k_hotpotqa/.
set -euo pipefail
cd "$(dirname "$0")/../.."
A=".venv/bin/arpo"
Q=runs/gsm8k_hotpotqa
SEARCH=(--search-top-k 2 --search-max-chars 200)     # short search results: the same in SFT data, RL and eval
mkdir -p "$Q"
$A sft-data gsm8k --data gsm8k:train --limit 64 --out $Q/sft_gsm8k.jsonl --quiet
$A sft-data hotpotqa --data hotpotqa:train --limit 32 "${SEARCH[@]}" --out $Q/sft_hotpotqa.jsonl --quiet
$A sft --config configs/sft_gsm8k_hotpotqa.yaml --overwrite --quiet
# the RL task set: 2 GSM8K + 2 HotpotQA training questions that are not in the SFT data
.venv/bin/python - <<'PY'
import json
from arpo.data.datasets import load_examples
rows = load_examples("gsm8k:train[1000:1002]") + load_examples("hotpotqa:train[200:202]")
open("runs/gsm8k_hotpotqa/rl_tasks.jsonl", "w").write("".join(json.dumps(r) + "\n" for r in rows))
PY
EVAL=(--data gsm8k:test hotpotqa:test --limit 8 "${SEARCH[@]}" --max-tool-calls 3 --max-response-tokens 512 --quiet)
$A eval --model $Q/sft "${EVAL[@]}" --out $Q/eval_sft.json              # before RL: the SFT start
$A train --config configs/train_gsm8k_hotpotqa.yaml --overwrite --quiet
$A eval --model $Q/arpo "${EVAL[@]}" --out $Q/eval_arpo.json            # after RL
$A compare sft=$Q/eval_sft.json arpo=$Q/eval_arpo.json
$A plot $Q/arpo
