#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.sh installs on a GPU node with no package index (issue 73): exactly
# what juice's engine, server and GPU-marked tests need beyond that node's fixed image (Python 3.12,
# torch 2.11 + CUDA 13, transformers 5.17, tokenizers 0.23.2, huggingface-hub 1.33 with its httpx
# and anyio, typer, rich, pytest, hypothesis, ...; no pydantic, FastAPI, uvicorn, openai, bm25s).
# That is transformers (juice needs >= 5.23: 5.17 converts the embedded Gemma's tokenizer wrongly),
# the server's stack and BM25 (the `auto` tests' distractor contexts). scripts/gpu-rehearse.sh
# proves the set complete: it builds that image's Python here, installs only these the same way and
# runs the check's dry run, whose `requirements` list every requirement still unmet and every
# carried wheel nothing needs. The versions are those of constraints/juice.txt. Written to .whl/
# (git-ignored): 17 wheels, 19 MiB, to be carried with the working tree (a device run's `carry`);
# pip must reach a package index here.
#
# Run: bash scripts/gpu-wheels.sh [DIR]    (default .whl)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.whl}"
PACKAGES=(transformers                                                      # juice's floor, above the image's
          fastapi starlette opentelemetry-api uvicorn prometheus_client   # juice serve
          pydantic pydantic_core annotated-types typing-inspection          # its request models
          openai jiter httpx2 httpcore2 truststore sniffio                  # the server tests' client
          bm25s)                                                            # auto's distractor contexts
PINS=()
for p in "${PACKAGES[@]}"; do
    pin=$(grep -i -m1 "^${p}==" constraints/juice.txt) || { echo "gpu-wheels.sh: $p is not in constraints/juice.txt" >&2; exit 1; }
    PINS+=("$pin")
done
rm -rf "$DIR"
mkdir -p "$DIR"
python -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DIR" "${PINS[@]}"
echo "gpu-wheels.sh: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sm "$DIR" | cut -f1) MiB in $DIR"
