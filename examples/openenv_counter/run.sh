#!/usr/bin/env bash
# Train on an OpenEnv environment on a laptop, end to end: the counter server (counter_env.py, started
# as a local process) -> worked trajectories played on it (make_sft.py, seeds 0..199) -> a short
# SFT of the embedded SmolLM2-135M -> eval on 100 held-out tasks (seeds 5000..5099, greedy) -> ARPO on
# the server's tasks (seeds 1000..) -> eval -> `arpo compare` (paired wins/losses on the same tasks).
# Run from anywhere: bash examples/openenv_counter/run.sh [RUN_SEED]   (default 0, or $RUN_SEED);
# each run seed has its own folder runs/openenv_counter/seed<RUN_SEED>/.
# Knobs (the test uses them to run it on a tiny model): ARPO_BIN, ARPO_PYTHON, ARPO_RUN_DIR (the
# folder), SFT_ROWS, HELDOUT_N, and extra `key=value` overrides in SFT_OVERRIDES / TRAIN_OVERRIDES and
# extra eval flags in EVAL_FLAGS (all word-split; empty arrays written for bash 3.2, macOS's).
set -euo pipefail
cd "$(dirname "$0")/../.."
A="${ARPO_BIN:-.venv/bin/arpo}"
PY="${ARPO_PYTHON:-.venv/bin/python}"
SEED="${1:-${RUN_SEED:-0}}"
Q="${ARPO_RUN_DIR:-runs/openenv_counter/seed$SEED}"
SPEC=openenv:examples.openenv_counter.counter_env:app
read -r -a SFT_OV <<< "${SFT_OVERRIDES:-}"
read -r -a TRAIN_OV <<< "${TRAIN_OVERRIDES:-}"
read -r -a EVAL_EXTRA <<< "${EVAL_FLAGS:-}"
# the held-out tasks, greedy, with train.yaml's budgets and reward
EVAL=(--data "$SPEC?n=${HELDOUT_N:-100}&seed=5000" --tools "$SPEC" --reward env --max-tool-calls 5
      --max-response-tokens 192 --quiet ${EVAL_EXTRA[@]+"${EVAL_EXTRA[@]}"})
mkdir -p "$Q"
stage() { echo "[openenv_counter seed $SEED] ${SECONDS} s: $*"; }

stage "worked trajectories"
$PY -m examples.openenv_counter.make_sft --n "${SFT_ROWS:-200}" --seed 0 --out "$Q/sft_data.jsonl"
stage "SFT"
$A sft --config examples/openenv_counter/sft.yaml "data.path=[$Q/sft_data.jsonl]" "run.dir=$Q/sft" \
  "run.seed=$SEED" ${SFT_OV[@]+"${SFT_OV[@]}"} --overwrite --quiet
stage "eval SFT"
$A eval --model "$Q/sft" "${EVAL[@]}" --out "$Q/eval_sft.json"
stage "ARPO"
$A train --config examples/openenv_counter/train.yaml "model.name=$Q/sft" "run.dir=$Q/arpo" "run.seed=$SEED" \
  ${TRAIN_OV[@]+"${TRAIN_OV[@]}"} --overwrite --quiet
stage "eval ARPO"
$A eval --model "$Q/arpo" "${EVAL[@]}" --out "$Q/eval_arpo.json"
$A compare sft="$Q/eval_sft.json" arpo="$Q/eval_arpo.json" --out "$Q/compare.json"
stage "done"
