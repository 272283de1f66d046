#!/usr/bin/env bash
# juice's GPU check in one call on a node with no package index (issues 48, 73): install the carried
# wheels (scripts/gpu-wheels.sh made them here, in .whl/) beside the image's own packages with
# `pip install --no-index --no-deps --target`, put them first on the path, and run
# benchmarks/gpu_check.py, which writes OUT/gpu-check.json and OUT/gpu-check.md after every step.
# On the device tool: carry [".whl"], command `bash benchmarks/gpu_check.sh $OUT --commit <sha>`.
# Extra arguments go to gpu_check.py (--budget-s SECONDS, default 480; --dry-run on the CPU;
# --skip tests). JUICE_WHEELS names another wheel folder; JUICE_CARRIED_SITE where they go.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: bash benchmarks/gpu_check.sh OUT [gpu_check.py options]}"
shift
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"
WHEELS="${JUICE_WHEELS:-.whl}"
export JUICE_CARRIED_SITE="${JUICE_CARRIED_SITE:-/tmp/juice-carried-site}"
mkdir -p "$OUT"
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    rm -rf "$JUICE_CARRIED_SITE"
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
        --target "$JUICE_CARRIED_SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$JUICE_CARRIED_SITE${PYTHONPATH:+:$PYTHONPATH}"
else
    echo "gpu_check.sh: no wheels in $WHEELS: the image's own packages only" >&2
    unset JUICE_CARRIED_SITE
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PYTHON" benchmarks/gpu_check.py "$OUT" "$@" 2>&1 | tee "$OUT/gpu-check.log"
exit "${PIPESTATUS[0]}"
