#!/usr/bin/env bash
# Issue 59, build item 1: which update settings keep the hop2 runs that collapsed in the branch-rules
# study (docs/results/branch_rules_hop2: the paper's rule seed 2, top_entropy seed 4) from collapsing.
# Usage (from the repository root, .venv installed): bash docs/results/anchored_ablation/run.sh OUT
# Re-creates the study's SFT start (8 steps, deterministic) and trains each (run, arm) for the study's
# 10 steps from the committed RL config, with one override set per arm; evaluates greedy on hop2:dev.
# Results (metrics, dev records) are copied next to this script as they finish.
set -euo pipefail
OUT=${1:?OUT dir}
HERE=docs/results/anchored_ablation
R=docs/results/branch_rules_hop2
A=.venv/bin/arpo
mkdir -p "$OUT"
if [ ! -d "$OUT/sft/checkpoints/step_000008" ]; then
  sed -e "s#/work/study41/branch_rules_hop2/sft_hop2.jsonl#$R/sft_hop2.jsonl#" \
      -e "s#dir: /work/study41/branch_rules_hop2/sft#dir: $OUT/sft#" $R/sft/config.yaml > "$OUT/sft.yaml"
  $A sft --config "$OUT/sft.yaml" --overwrite
fi
declare -A ARMS=(
  [lr3e-6]="optim.lr=3e-6"
  [lr3e-6_mb2]="optim.lr=3e-6 minibatches=2"
  [lr1e-5_wu3_mb2]="optim.lr=1e-5 optim.warmup_steps=3 minibatches=2"
)
# ARMS_ORDER / RUNS_ORDER: which (run, arm) pairs first (the default: one arm on every run, then the next arm)
for arm in ${ARMS_ORDER:-lr3e-6_mb2 lr1e-5_wu3_mb2 lr3e-6}; do
  for run in ${RUNS_ORDER:-arpo_seed2 arpo@top_entropy_seed4}; do
    d="$OUT/rl/${run}__$arm"
    keep="$HERE/rl/${run}__$arm"
    [ -f "$keep/dev.json" ] && continue
    sed -e "s#name: /work/study41/branch_rules_hop2/sft/checkpoints/step_000008/model#name: $OUT/sft/checkpoints/step_000008/model#" \
        -e "s#dir: /work/study41/branch_rules_hop2/rl/$run#dir: $d#" "$R/rl/$run/config.yaml" > "$OUT/$run.yaml"
    # shellcheck disable=SC2086
    $A train --config "$OUT/$run.yaml" ${ARMS[$arm]} run.save_rollouts=1 --overwrite
    $A eval --model "$d/checkpoints/step_000010/model" --data hop2:dev --out "$d/dev.json" --quiet
    mkdir -p "$keep"
    cp "$d/metrics.jsonl" "$d/config.yaml" "$d/dev.json" "$keep/"
  done
done
