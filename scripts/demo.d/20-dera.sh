#!/usr/bin/env bash
# DERA demo: summarization of two sample encounters and DERA-QA on five sample questions,
# embedded model, shortened settings (configs/demo-*.yaml) so it finishes in minutes on a CPU.
set -euo pipefail
MS=${MS:-.venv/bin/medstack}
OUT=${OUT:-runs/demo}
CFG=experiments/dera/configs

echo "-- DERA summarization, 2 sample encounters"
$MS run dera-summarize --model embedded --limit 2 --config "$CFG/demo-summarize.yaml" --out "$OUT/dera-summarize" > /dev/null
cat "$OUT/dera-summarize/summary.md"

echo "-- DERA-QA (open-ended), 5 sample questions: 1-shot vs DERA"
$MS run dera-qa --model embedded --limit 5 --config "$CFG/demo-qa.yaml" --out "$OUT/dera-qa" > /dev/null
cat "$OUT/dera-qa/summary.md"
