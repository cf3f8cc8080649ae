#!/usr/bin/env bash
# Fine-tuning demo: a few LoRA steps of the embedded model on the tiny MediTOD-format fixture
# (CPU, float32; tests/fixtures/finetune/test-cpu.yaml), then the adapter's loss curve numbers.
set -euo pipefail
MS=${MS:-.venv/bin/medstack}
OUT=${OUT:-runs/demo}

echo "-- LoRA fine-tuning, MediTOD NLU, embedded model, 6 steps on the fixture"
$MS finetune meditod-nlu --base embedded --data tests/fixtures/finetune/dialogs.json \
    --config tests/fixtures/finetune/test-cpu.yaml --out "$OUT/finetune-nlu" 2> /dev/null
echo "adapter: $OUT/finetune-nlu/adapter  (serve: $MS serve --model embedded --lora nlu=$OUT/finetune-nlu/adapter)"
