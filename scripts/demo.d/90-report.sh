#!/usr/bin/env bash
# Last demo step: ONE offline HTML report over every run folder the demo wrote under $OUT. It opens with the
# papers: each study's tables and figures beside the published values (CRAFT-MD, DERA, MediTOD, autoeval),
# then fine-tuning and the runs' cases.
set -euo pipefail
MS=${MS:-.venv/bin/medstack}
OUT=${OUT:-runs/demo}
if ! find "$OUT" \( -name records.jsonl -o -name metrics.json -o -name bench.json -o -name train_metrics.json \) -print -quit 2>/dev/null | grep -q .; then
  echo "no run folders under $OUT yet; nothing to report"
  exit 0
fi
REPORT=$("$MS" report "$OUT" --out "$OUT/report.html" | tail -n 1)
sections=$(grep -o 'id="section-[a-z]*"' "$OUT/report.html" | sed 's/id="section-//; s/"//' | paste -sd ' ' -)
echo "report: $REPORT  (open it in a browser; it is one self-contained offline file)"
echo "sections, in order: $sections"
