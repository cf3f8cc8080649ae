#!/usr/bin/env bash
# Demo step: rubric auto-evaluation (AMIE-style self-CoT judge) of the CRAFT-MD demo run's dialogues.
# Runs after 30-craftmd.sh, which writes "$OUT/craftmd". Env: MS (medstack binary), OUT (demo out dir).
set -euo pipefail
MS=${MS:-.venv/bin/medstack}
OUT=${OUT:-runs/demo}

src=""
if [ -f "$OUT/craftmd/records.jsonl" ]; then
  src="$OUT/craftmd"
elif [ -d "$OUT/craftmd" ]; then
  rec=$(find "$OUT/craftmd" -name records.jsonl -print 2>/dev/null | sort | head -n 1)
  [ -n "$rec" ] && src=$(dirname "$rec")
fi
if [ -z "$src" ] || ! grep -q '"transcript"' "$src/records.jsonl"; then
  echo "no CRAFT-MD dialogues under $OUT/craftmd; rating the autoeval fixture dialogues instead"
  src=tests/fixtures/autoeval/results
fi

# the embedded 270M base model judges better as a text continuation (embedded-completion.yaml)
$MS autoeval "$src" --judge-model embedded --criteria empathy,concerns,welfare,understanding \
  --limit 2 --config experiments/studies/autoeval/configs/embedded-completion.yaml --out "$OUT/autoeval"
