#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.sh installs on a GPU machine that has no package index: what juice
# and its engine, steering, baselines and server tests need there beyond that machine's image
# (Python 3.12, torch 2.11 + CUDA 13, transformers 5.17, which juice refuses: it needs >= 5.23).
# The versions are those of constraints/juice.txt. Written to .whl/ (git-ignored), about 20 MB, to
# be carried with the working tree (a device run's `carry`); pip must reach a package index here.
#
# Run: bash scripts/gpu-wheels.sh [DIR]    (default .whl)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.whl}"
PACKAGES=(transformers fastapi starlette uvicorn pydantic pydantic_core annotated-types typing-inspection
          openai jiter httpx2 httpcore2 truststore sniffio opentelemetry-api anyio typing_extensions)
PINS=()
for p in "${PACKAGES[@]}"; do
    pin=$(grep -i -m1 "^${p}==" constraints/juice.txt) || { echo "gpu-wheels.sh: $p is not in constraints/juice.txt" >&2; exit 1; }
    PINS+=("$pin")
done
mkdir -p "$DIR"
python -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DIR" "${PINS[@]}"
du -sh "$DIR"
