#!/usr/bin/env bash
# juice's vLLM plugin on a GPU in one call (issue 65): benchmarks/gpu_check_vllm.py, which writes
# OUT/gpu-check-vllm.json and .md. Needs vLLM 0.32's CUDA build and juice in the Python it runs
# (VLLM_PYTHON, default python3): the lent device machines have neither (vLLM's wheel is 326 MB and
# pins torch 2.13; a call carries 64 MiB), so this runs where `pip install vllm==0.32.0` and
# `pip install -e .` have been done. Extra arguments go to gpu_check_vllm.py (--dry-run: on a CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: bash benchmarks/gpu_check_vllm.sh OUT [--dry-run]}"
shift
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"
if ! "${VLLM_PYTHON:-$PYTHON}" -c "import vllm" 2>/dev/null; then
    echo "gpu_check_vllm.sh: no vLLM in ${VLLM_PYTHON:-$PYTHON} (pip install vllm==0.32.0 there, or set VLLM_PYTHON)" >&2
    exit 1
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
"$PYTHON" benchmarks/gpu_check_vllm.py "$OUT" "$@" 2>&1 | tee "$OUT/gpu-check-vllm.log"
