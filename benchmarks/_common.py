"""Shared helpers for the benchmarks: wall time and peak resident memory of a call; the commit a
record comes from."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable

import psutil


@dataclass
class Measured:
    seconds: float
    peak_mib: float      # peak resident memory above the level before the call
    value: Any


def measure(fn: Callable[[], Any], interval: float = 0.01) -> Measured:
    """Run `fn` once; return its wall time, peak RSS growth (sampled every `interval` s), result."""
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = base
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, proc.memory_info().rss)
            time.sleep(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    start = time.perf_counter()
    try:
        value = fn()
    finally:
        seconds = time.perf_counter() - start
        done.set()
        thread.join()
    return Measured(seconds, (max(peak, proc.memory_info().rss) - base) / 2**20, value)


def report(name: str, fast: Measured, slow: Measured, target: str) -> float:
    ratio = slow.seconds / fast.seconds
    print(f"{name}: fast {fast.seconds:.2f}s (peak +{fast.peak_mib:.0f} MiB), "
          f"reference {slow.seconds:.2f}s (peak +{slow.peak_mib:.0f} MiB), ratio {ratio:.2f}x  [target {target}]")
    return ratio


def git_state() -> dict:
    """This checkout's commit and whether its tracked files have uncommitted changes, for a record's
    provenance (read when the command starts)."""
    root = Path(__file__).resolve().parents[1]

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=root).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
