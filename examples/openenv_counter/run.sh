#!/usr/bin/env bash
# Train on an OpenEnv environment on a laptop, end to end: the counter server (counter_env.py, started
# as a local process) -> worked trajectories played on it (make_sft.py, seeds 0..199) -> a short
# SFT of the embedded SmolLM2-135M -> eval on 100 held-out tasks (seeds 5000..5099; greedy, and sampled
# at temperature 1) -> per RL seed: ARPO on the server's tasks (seeds 1000..) -> the same evals ->
# `arpo compare` and the per-seed comparison with the SFT start (python -m examples.paired_seeds).
# Run from anywhere:
#   bash examples/openenv_counter/run.sh                # one RL seed
#   SEEDS="0 1 2" bash examples/openenv_counter/run.sh  # a seed is a run: the multi-seed rate
# Knobs (the test uses them to run it on a tiny model): ARPO_BIN, ARPO_PYTHON, ARPO_RUN_DIR (the
# folder, default runs/openenv_counter), SFT_ROWS, HELDOUT_N, and extra `key=value` overrides in
# SFT_OVERRIDES / TRAIN_OVERRIDES and extra eval flags in EVAL_FLAGS (all word-split; empty arrays
# written for bash 3.2, macOS's).
set -euo pipefail
cd "$(dirname "$0")/../.."
A="${ARPO_BIN:-.venv/bin/arpo}"
PY="${ARPO_PYTHON:-.venv/bin/python}"
Q="${ARPO_RUN_DIR:-runs/openenv_counter}"
SPEC=openenv:examples.openenv_counter.counter_env:app
read -r -a SFT_OV <<< "${SFT_OVERRIDES:-}"
read -r -a TRAIN_OV <<< "${TRAIN_OVERRIDES:-}"
read -r -a EVAL_EXTRA <<< "${EVAL_FLAGS:-}"
# the held-out tasks with train.yaml's budgets and reward; 50 episodes at a time (the server holds 64)
EVAL=(--data "$SPEC?n=${HELDOUT_N:-100}&seed=5000" --tools "$SPEC" --reward env --max-tool-calls 5
      --max-response-tokens 192 --batch-size 50 --quiet ${EVAL_EXTRA[@]+"${EVAL_EXTRA[@]}"})
SAMPLED=(--temperature 1 --samples 2 --seed 0)
mkdir -p "$Q"
stage() { echo "[openenv_counter] ${SECONDS} s: $*"; }

stage "worked trajectories"
$PY -m examples.openenv_counter.make_sft --n "${SFT_ROWS:-200}" --seed 0 --out "$Q/sft_data.jsonl"
stage "SFT"
$A sft --config examples/openenv_counter/sft.yaml "data.path=[$Q/sft_data.jsonl]" "run.dir=$Q/sft" \
  ${SFT_OV[@]+"${SFT_OV[@]}"} --overwrite --quiet
stage "eval SFT"
$A eval --model "$Q/sft" "${EVAL[@]}" --out "$Q/eval_sft.json"
$A eval --model "$Q/sft" "${EVAL[@]}" "${SAMPLED[@]}" --out "$Q/eval_sft_t1.json"
greedy=() sampled=()
for s in ${SEEDS:-0}; do
  stage "ARPO seed $s"
  $A train --config examples/openenv_counter/train.yaml "model.name=$Q/sft" "run.dir=$Q/arpo_s$s" "run.seed=$s" \
    ${TRAIN_OV[@]+"${TRAIN_OV[@]}"} --overwrite --quiet
  stage "eval ARPO seed $s"
  $A eval --model "$Q/arpo_s$s" "${EVAL[@]}" --out "$Q/eval_arpo_s$s.json"
  $A eval --model "$Q/arpo_s$s" "${EVAL[@]}" "${SAMPLED[@]}" --out "$Q/eval_arpo_s${s}_t1.json"
  $A compare sft="$Q/eval_sft.json" arpo="$Q/eval_arpo_s$s.json" --out "$Q/compare_s$s.json"
  greedy+=("$Q/eval_arpo_s$s.json") sampled+=("$Q/eval_arpo_s${s}_t1.json")
done
$PY -m examples.paired_seeds --start "$Q/eval_sft.json" --runs "${greedy[@]}" \
  --sampled-start "$Q/eval_sft_t1.json" --sampled-runs "${sampled[@]}" --out "$Q/results.json"
stage "done"
