#!/usr/bin/env bash
# Demo step: CRAFT-MD on 3 published cases, 1 trial, MCQ and FRQ in all four formats, with the embedded
# model as clinical LLM, patient-AI, summarizer and grader; then the hand-made published-format folder
# is imported and `compare` puts both side by side (summary.md, compare.json, accuracy.png).
# Writes "$OUT/craftmd" (read by 40-autoeval.sh). Env: MS (medstack binary), OUT (demo out dir).
set -euo pipefail
MS=${MS:-.venv/bin/medstack}
OUT=${OUT:-runs/demo}
DATA=${CRAFTMD_DATA:-/work/shared/data/craftmd/usmle_and_derm_dataset.csv}
[ -f "$DATA" ] || DATA=tests/fixtures/craftmd/cases.csv   # the published file is not part of the repo

$MS run craftmd --data "$DATA" --limit 3 --trials 1 --mcq --frq \
  --clinical-model embedded --patient-model embedded --grader-model embedded \
  --config experiments/craftmd/configs/embedded-small.yaml --out "$OUT/craftmd"

$MS import craftmd tests/fixtures/craftmd/published_demo --name published-demo \
  --cases tests/fixtures/craftmd/cases.csv --out "$OUT/craftmd-published" > /dev/null

$MS compare "$OUT/craftmd" "$OUT/craftmd-published" --out "$OUT/craftmd-compare" | sed -n '1,/^## Paired tests/p'
echo "chart: $OUT/craftmd-compare/accuracy.png"
