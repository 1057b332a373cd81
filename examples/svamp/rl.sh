#!/usr/bin/env bash
# The longer SVAMP RL recipe (issue 18): 20 ARPO steps (configs/svamp_rl.yaml) from the
# quick start's SFT model, then the SFT and ARPO models evaluated greedily on svamp:test[0:200] with
# the same 96-token budget, and the paired comparison. Run ./quickstart.sh first (it makes
# runs/quickstart/sft). An old record of an older code version (2026-12-04, before that day's changes
# to seeded sampling and attribution; not re-measured): training 17.6 min, each eval ~1.5 min;
# 0.190 -> 0.275, paired +22 / -5 (significant; seed 1: 0.235, +18 / -9, noise). Pass algo.preset=grpo to train the GRPO baseline.
set -euo pipefail
cd "$(dirname "$0")/../.."
A=".venv/bin/arpo"
R=runs/svamp_rl
EVAL=(--data 'svamp:test[0:200]' --template calc --max-tool-calls 2 --max-response-tokens 96 --batch-size 64 --quiet)
$A train --config configs/svamp_rl.yaml --overwrite --quiet "$@"
$A eval --model runs/quickstart/sft "${EVAL[@]}" --out $R/eval_sft.json
$A eval --model $R "${EVAL[@]}" --out $R/eval_arpo.json
$A compare sft=$R/eval_sft.json arpo=$R/eval_arpo.json
