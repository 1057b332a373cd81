#!/usr/bin/env bash
# The quick start: cold-start SFT data -> SFT -> a few ARPO steps -> eval on held-out questions,
# with the embedded SmolLM2-135M, real python and search tools, on CPU (~15 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")"
A=".venv/bin/arpo"
D=../shared/data
Q=runs/quickstart
mkdir -p "$Q"
[ -f ~/.cache/arpo/indexes/hotpotqa/meta.json ] || $A index build $D/hotpotqa/*.jsonl --quiet
$A sft-data gsm8k --data $D/gsm8k/train.jsonl --limit 64 --out $Q/sft_gsm8k.jsonl --quiet
$A sft-data hotpotqa --data $D/hotpotqa/train.jsonl --limit 32 --out $Q/sft_hotpotqa.jsonl --quiet
$A sft --config configs/sft_quickstart.yaml --quiet
# RL prompts: a GSM8K + HotpotQA mix (later rows than the SFT ones)
python3 - <<'PY'
import json
g = [json.loads(x) for x in open("../shared/data/gsm8k/train.jsonl")][1000:1008]
h = [json.loads(x) for x in open("../shared/data/hotpotqa/train.jsonl")][200:208]
rows = [{"question": r["question"], "answer": r["answer"].split("####")[-1].strip(), "task": "math"} for r in g]
rows += [{"question": r["question"], "answer": r["answer"], "task": "qa"} for r in h]
rows = [rows[i // 2 + (len(rows) // 2) * (i % 2)] for i in range(len(rows))]  # interleave math / qa
open("runs/quickstart/mix.jsonl", "w").write("".join(json.dumps(r) + "\n" for r in rows))
PY
$A train --config configs/train_quickstart.yaml --quiet
$A eval --model $Q/arpo --data $D/gsm8k/test.jsonl --limit 8 --tools python --out $Q/eval_gsm8k.json --quiet
$A eval --model $Q/arpo --data $D/hotpotqa/test.jsonl --limit 8 --tools search --top-k 3 --max-chars 300 --out $Q/eval_hotpotqa.json --quiet
$A plot $Q/arpo
