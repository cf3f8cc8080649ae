#!/usr/bin/env bash
# Demo step: MediTOD NLU in-context (k=5 retrieved exemplars) on the first test dialogue with the embedded model,
# then its metrics table. Env: MS (medstack binary), OUT (demo out dir); MEDITOD_DATA (dialogs.json; default: the
# public sample if fetched (`medstack data fetch meditod-sample`), else our test fixture), MEDITOD_LIMIT (turns of the dialogue to run, default 8; "all" for every turn).
# DEMO ONLY: replies are capped at 128 tokens (the study's setting is 256). Every gold NLU answer of the public
# sample's test dialogue and of the fixture is at most 92 tokens, and the embedded base model, which does not end
# its chat turn, otherwise writes 256 tokens for each turn.
set -euo pipefail
MS=${MS:-.venv/bin/medstack}
OUT=${OUT:-runs/demo}
DATA=${MEDITOD_DATA:-}
if [ -z "$DATA" ] && ! DATA=$($MS data path meditod-sample 2>/dev/null); then
  DATA=tests/fixtures/meditod/dialogs.json
  echo "data: test fixture; for MediTOD's public sample run: $MS data fetch meditod-sample  (offline: --from FOLDER with dialogs.json and the *_ids.json)"
fi
LIMIT=${MEDITOD_LIMIT:-8}
limit_args=(--limit "$LIMIT")
[ "$LIMIT" = all ] && limit_args=()

echo "data: $DATA"
# a demo run on other dialogues cannot be resumed: start it over
if [ -d "$OUT/meditod" ] && [ "$(cat "$OUT/.meditod-data" 2>/dev/null)" != "$DATA" ]; then rm -rf "$OUT/meditod"; fi
mkdir -p "$OUT/meditod" && echo "$DATA" > "$OUT/.meditod-data"
$MS data meditod --data "$DATA" --png "$OUT/meditod/data.png"
first=$(python3 -c "import json,sys,os; print(json.load(open(os.path.join(os.path.dirname(sys.argv[1]),'test_ids.json')))[0])" "$DATA")
echo "first test dialogue: $first"
# the run prints its summary.md (metrics table + sustained tokens/s)
$MS run meditod-nlu --data "$DATA" --split test --mode icl --k 5 --max-tokens 128 --model embedded "${limit_args[@]}" --out "$OUT/meditod/nlu-icl"
