#!/usr/bin/env bash
# One call on a GPU machine (issue 48): install the carried wheels (scripts/gpu-wheels.sh made them
# here, in .whl/), then run benchmarks/gpu_check.py, which writes OUT/gpu-check.json and .md.
# On the device tool: carry [".whl"], command `bash benchmarks/gpu_check.sh $OUT`.
# Extra arguments go to gpu_check.py (e.g. --skip bench, --device cpu --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: bash benchmarks/gpu_check.sh OUT [gpu_check.py options]}"
shift
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/juice-site .whl/*.whl
    export PYTHONPATH="/tmp/juice-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
"$PYTHON" benchmarks/gpu_check.py "$OUT" "$@" 2>&1 | tee "$OUT/gpu-check.log"
