#!/usr/bin/env bash
# Remake the heads files juice ships for its embedded models (src/juice/stage1/shipped/): the main
# job on each model, toward memory and toward the context, then its heads with the betas tuned on
# D's own split (juice.experiments.shipped_heads). About 20 minutes per model on 2 cores; the runs
# resume from runs/<model>/state if interrupted. Run from a clean checkout: the files record its commit.
set -euo pipefail
cd "$(dirname "$0")/.."
for model in ${JUICE_SHIP_MODELS:-gemma-3-270m smollm2-135m}; do
  juice reproduce --model "$model" --out "runs/$model"
  juice reproduce --model "$model" --direction contextual --out "runs/$model"
  python -m juice.experiments.shipped_heads "runs/$model" "$model"
done
