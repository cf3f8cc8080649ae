#!/usr/bin/env bash
# `make demo`: the main jobs on the embedded default model, end to end, on this machine.
# Starts one server (or reuses a running one), runs each demo step against it, stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
MS=.venv/bin/medstack
OUT=${DEMO_OUT:-runs/demo}
mkdir -p "$OUT"

started=0
if ! $MS serve status --json | grep -q '"alias": "embedded"'; then
  $MS serve --model embedded --port "${DEMO_PORT:-8000}" --runtime-lora --detach
  started=1
fi
cleanup() { if [ "$started" = 1 ]; then $MS serve stop embedded; fi; }
trap cleanup EXIT

echo "== chat round-trip with the embedded model"
$MS chat --model embedded --max-tokens 40 "A 45-year-old with chest pain radiating to the left arm most likely has"

for step in scripts/demo.d/*.sh; do
  [ -e "$step" ] || continue
  echo
  echo "== $(basename "$step" .sh)"
  OUT="$OUT" MS="$MS" bash "$step"
done
