#!/usr/bin/env bash
# Bring your own tool, end to end: worked examples -> SFT -> eval -> ARPO -> eval, with the plug-in
# `sql` tool over a small SQLite shop database. Run from the repository root: bash examples/sql/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
A=".venv/bin/arpo"
TOOL=examples.sql.sql_tool:Sql
EVAL=(--data examples/sql/heldout.jsonl --tools $TOOL --max-tool-calls 2 --max-response-tokens 160 --quiet)
$A sft-data tools --data examples/sql/train.jsonl --tools $TOOL --out runs/sql/sft_data.jsonl --quiet
$A sft --config examples/sql/sft.yaml --overwrite --quiet
$A eval --model runs/sql/sft "${EVAL[@]}" --out runs/sql/eval_sft.json
$A train --config examples/sql/train.yaml --overwrite --quiet
$A eval --model runs/sql/arpo "${EVAL[@]}" --out runs/sql/eval_arpo.json
$A compare sft=runs/sql/eval_sft.json arpo=runs/sql/eval_arpo.json
