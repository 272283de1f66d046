#!/usr/bin/env bash
# The GPU check rehearsed on the CPU (issue 73): a copy of the GPU node's fixed image, as closely as
# the package index allows, with only the carried wheels installed the way benchmarks/gpu_check.sh
# installs them there, then the check's dry run (benchmarks/gpu_check.py --dry-run): an import or a
# requirement that the carried set lacks fails here, not on the node.
#
# The image: Python 3.12 where this machine has it (else the local Python, and the record says so);
# torch 2.11.0 (PyPI's build, which carries CUDA 13 as the node's does and runs on the CPU: the index
# has no CPU build of 2.11.0), transformers 5.17.0, triton 3.6, accelerate 1.15, numpy 2.5,
# safetensors 0.8, tokenizers 0.23.2, huggingface-hub 1.33, sentencepiece, typer, rich, pyyaml,
# matplotlib, scipy, pandas, pytest, hypothesis, with whatever they pull in; then what the node has
# not (pydantic and its types, FastAPI, uvicorn, openai, prometheus-client, gguf, bm25s) removed.
# It is built once (about 5 GB, a minute or two) in JUICE_REHEARSE_VENV (default
# ~/.cache/juice/gpu-node-venv) and reused while this list is unchanged. The wheels are made afresh
# by scripts/gpu-wheels.sh into OUT/wheels.
#
# Run: bash scripts/gpu-rehearse.sh [OUT] [gpu_check.py options]   (default OUT /tmp/juice-gpu-rehearsal)
# Exit status: gpu_check.py's (0: every section ran and no requirement is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-/tmp/juice-gpu-rehearsal}"
shift || true
IMAGE=(torch==2.11.0 transformers==5.17.0 "triton==3.6.*" accelerate==1.15.0 "numpy==2.5.*" "safetensors==0.8.*"
       tokenizers==0.23.2 "huggingface-hub==1.33.*" sentencepiece typer rich pyyaml matplotlib scipy pandas pytest
       hypothesis)
ABSENT=(pydantic pydantic_core annotated-types typing-inspection fastapi starlette uvicorn openai prometheus_client
        gguf bm25s)

node_python() {
    local candidates=("${JUICE_REHEARSE_PYTHON:-}" python3.12)
    local root
    root="$(pyenv root 2>/dev/null || true)"
    [[ -n "$root" ]] && candidates+=("$root"/versions/3.12*/bin/python3.12)
    for c in "${candidates[@]}"; do
        if [[ -n "$c" ]] && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            echo "$c"
            return
        fi
    done
    echo "gpu-rehearse.sh: no Python 3.12 here: the local Python stands in for the node's" >&2
    command -v python3
}

PY="$(node_python)"
VENV="${JUICE_REHEARSE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/juice/gpu-node-venv}"
WANT="$("$PY" --version) | ${IMAGE[*]} | without ${ABSENT[*]}"
if [[ ! -f "$VENV/.juice-image" || "$(cat "$VENV/.juice-image")" != "$WANT" ]]; then
    echo "gpu-rehearse.sh: building the node's image in $VENV ($WANT)"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${IMAGE[@]}"
    "$VENV/bin/python" -m pip uninstall -q -y "${ABSENT[@]}" 2>/dev/null || true
    echo "$WANT" > "$VENV/.juice-image"
fi
mkdir -p "$OUT"
"$VENV/bin/python" -m pip list --disable-pip-version-check --format=freeze > "$OUT/image-packages.txt"
bash scripts/gpu-wheels.sh "$OUT/wheels"
PYTHON="$VENV/bin/python" JUICE_WHEELS="$OUT/wheels" JUICE_CARRIED_SITE="$OUT/carried-site" \
    bash benchmarks/gpu_check.sh "$OUT" --dry-run "$@"
