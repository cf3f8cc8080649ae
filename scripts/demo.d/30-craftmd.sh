#!/usr/bin/env bash
# Demo step: CRAFT-MD on 3 published cases, 1 trial, MCQ and FRQ in all four formats, with the embedded
# model as clinical LLM, patient-AI, summarizer and grader; then the authors' GPT-3.5 release (once fetched) or a
# hand-made published-format folder is imported and `compare` puts both side by side (summary.md, compare.json, accuracy.png).
# The embedded config keeps what the base model needs (turn/summary stops, a deterministic grader, text
# completions) as named deviations, listed in the run's summary.md and the paper table's footnote.
# Writes "$OUT/craftmd" (read by 40-autoeval.sh). Env: MS (medstack binary), OUT (demo out dir).
set -euo pipefail
MS=${MS:-.venv/bin/medstack}
OUT=${OUT:-runs/demo}
# the published cases once fetched (`medstack data fetch craftmd-cases`), else the hand-made fixture
DATA=${CRAFTMD_DATA:-}
if [ -z "$DATA" ] && ! DATA=$($MS data path craftmd-cases 2>/dev/null); then
  DATA=tests/fixtures/craftmd/cases.csv
  echo "published CRAFT-MD cases not fetched, using the fixture; to fetch them: $MS data fetch craftmd-cases  (offline: --from PATH/usmle_and_derm_dataset.csv)"
fi
echo "cases: $DATA"
# a demo run on other cases (e.g. the fixture, before `data fetch`) cannot be resumed: start it (and the ratings of its dialogues) over
if [ -d "$OUT/craftmd" ] && [ "$(cat "$OUT/.craftmd-data" 2>/dev/null)" != "$DATA" ]; then rm -rf "$OUT/craftmd" "$OUT/autoeval"; fi
mkdir -p "$OUT" && echo "$DATA" > "$OUT/.craftmd-data"

$MS run craftmd --data "$DATA" --limit 3 --trials 1 --mcq --frq \
  --clinical-model embedded --patient-model embedded --grader-model embedded \
  --config experiments/studies/craftmd/configs/embedded-small.yaml --out "$OUT/craftmd"

# the authors' GPT-3.5 release when it and the real cases are fetched (so `compare` pairs the same cases),
# else the hand-made published-format fixture (paired with the fixture cases)
rm -rf "$OUT/craftmd-published"
if [ "$DATA" != tests/fixtures/craftmd/cases.csv ] && $MS data path craftmd-published-gpt3_1106 > /dev/null 2>&1; then
  $MS import craftmd craftmd-published-gpt3_1106 --name gpt-3.5-published --cases "$DATA" --out "$OUT/craftmd-published" > /dev/null
else
  $MS import craftmd tests/fixtures/craftmd/published_demo --name published-demo \
    --cases tests/fixtures/craftmd/cases.csv --out "$OUT/craftmd-published" > /dev/null
fi

$MS compare "$OUT/craftmd" "$OUT/craftmd-published" --out "$OUT/craftmd-compare" | sed -n '1,/^## Paired tests/p'
echo "chart: $OUT/craftmd-compare/accuracy.png"
