"""The README's ten-line quick start, timed as a newcomer runs it: a fresh Python process, the
embedded Gemma 3 270M installed but never loaded (an empty `$JUICE_CACHE`, so the GGUF file is
dequantized as on a first run), until the third steered text is printed; then once more with the
cache warm. Prints both wall times against the 60 s goal (issue 63) and checks the printed text
is the README's.

Run: python benchmarks/bench_quick_start.py   (about 1-2 minutes; nothing else on the machine)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 60.0


def quick_start(page: Path = ROOT / "README.md") -> tuple[str, str]:
    """The page's quick start (Python) and the output it shows."""
    found = re.search(r"```python\n(import juice\n.*?for method, direction in runs:.*?)```\s*```text\n(.*?)```",
                      page.read_text(encoding="utf-8"), re.S)
    if not found:
        raise SystemExit(f"{page} has no quick start with its output")
    return found.group(1), found.group(2)


def timed_run(code: str, cache: str) -> tuple[float, str]:
    env = {**os.environ, "JUICE_CACHE": cache}
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, run.stdout


def main() -> None:
    code, shown = quick_start()
    with tempfile.TemporaryDirectory() as cache:
        cold, out_cold = timed_run(code, cache)
        warm, out_warm = timed_run(code, cache)
    same = out_cold == shown and out_warm == shown
    print(f"quick start, first run (GGUF dequantized, empty cache): {cold:.1f} s (goal < {GOAL_S:.0f} s: "
          f"{'met' if cold < GOAL_S else 'missed'})")
    print(f"quick start, cache warm: {warm:.1f} s")
    print(f"printed text equals the README's: {same}")
    if not same:
        print(out_cold)


if __name__ == "__main__":
    main()
