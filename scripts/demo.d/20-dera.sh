#!/usr/bin/env bash
# DERA demo: summarization of two sample encounters and DERA-QA on five sample questions,
# embedded model, shortened settings (configs/demo-*.yaml) so it finishes in minutes on a CPU.
set -euo pipefail
MS=${MS:-.venv/bin/medstack}
OUT=${OUT:-runs/demo}
CFG=experiments/studies/dera/configs

echo "-- DERA summarization, 2 sample encounters"
$MS run dera-summarize --model embedded --limit 2 --config "$CFG/demo-summarize.yaml" --out "$OUT/dera-summarize" > /dev/null
cat "$OUT/dera-summarize/summary.md"

echo "-- DERA-QA (open-ended), 5 questions: 1-shot vs DERA"
qa_data=()   # the published open-ended MedQA test split once fetched, else the shipped 5-question sample
if QA=$($MS data path medqa-open 2>/dev/null); then
  qa_data=(--data "$QA" --split test)
  echo "questions: $QA (test split)"
else
  echo "questions: shipped sample; for the published open-ended MedQA: $MS data fetch medqa-open"
fi
# a demo run on other questions cannot be resumed: start it over
if [ -d "$OUT/dera-qa" ] && [ "$(cat "$OUT/.dera-qa-data" 2>/dev/null)" != "${QA:-sample}" ]; then rm -rf "$OUT/dera-qa"; fi
mkdir -p "$OUT" && echo "${QA:-sample}" > "$OUT/.dera-qa-data"
$MS run dera-qa --model embedded --limit 5 "${qa_data[@]}" --config "$CFG/demo-qa.yaml" --out "$OUT/dera-qa" > /dev/null
cat "$OUT/dera-qa/summary.md"
