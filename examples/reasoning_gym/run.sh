#!/usr/bin/env bash
# Train on a reasoning-gym generator with ARPO, end to end (examples/reasoning_gym/README.md):
# worked examples of EASY basic_arithmetic tasks -> SFT -> eval on 100 held-out HARDER tasks (greedy and
# sampled) -> ARPO with the python tool on other harder tasks, graded by reasoning-gym's score_answer ->
# eval -> the paired per-seed comparison. From the repository root:
#   bash examples/reasoning_gym/run.sh               # one RL seed (~15 min on 2 cores)
#   SEEDS="0 1 2" bash examples/reasoning_gym/run.sh # a seed is a run: the multi-seed rate
# ARPO=/path/to/arpo, PYTHON=..., R=runs/... override the binaries and the output folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
A=${ARPO:-.venv/bin/arpo}
P=${PYTHON:-.venv/bin/python}
R=${R:-runs/rg}
mkdir -p "$R"
EASY='rg:basic_arithmetic?size=160&seed=0&min_terms=2&max_terms=3&max_digits=1&allow_negation=false&operators=["+","-","*"]'
HELD='rg:basic_arithmetic?size=100&seed=5000&min_terms=3&max_terms=5&max_digits=2'
EVAL=(--data "$HELD" --tools python --template calc --reward rg --max-tool-calls 2 --max-response-tokens 96
      --batch-size 100 --quiet)
SAMPLED=(--temperature 1 --samples 2 --seed 0)
$P -m examples.reasoning_gym.make_worked "$EASY" "$R/worked.jsonl"
$A sft-data tools --data "$R/worked.jsonl" --tools python --template calc --out "$R/sft_data.jsonl" --quiet
$A sft --config examples/reasoning_gym/sft.yaml --overwrite --quiet data.path="[$R/sft_data.jsonl]" run.dir="$R/sft"
$A eval --model "$R/sft" "${EVAL[@]}" --out "$R/eval_sft.json"
$A eval --model "$R/sft" "${EVAL[@]}" "${SAMPLED[@]}" --out "$R/eval_sft_t1.json"
greedy=() sampled=()
for s in ${SEEDS:-0}; do
  $A train --config examples/reasoning_gym/train.yaml --overwrite --quiet model.name="$R/sft" \
    run.dir="$R/arpo_s$s" run.seed="$s"
  $A eval --model "$R/arpo_s$s" "${EVAL[@]}" --out "$R/eval_arpo_s$s.json"
  $A eval --model "$R/arpo_s$s" "${EVAL[@]}" "${SAMPLED[@]}" --out "$R/eval_arpo_s${s}_t1.json"
  greedy+=("$R/eval_arpo_s$s.json") sampled+=("$R/eval_arpo_s${s}_t1.json")
done
$A compare sft="$R/eval_sft.json" arpo="${greedy[0]}"
$P -m examples.paired_seeds --start "$R/eval_sft.json" --runs "${greedy[@]}" \
  --sampled-start "$R/eval_sft_t1.json" --sampled-runs "${sampled[@]}" --out "$R/results.json"
