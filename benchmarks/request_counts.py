"""Registry lookups and steering parses per request on `juice serve` (issue 91's count).

Serves a tiny random Llama with a heads file (juice serve's app, in a thread, asked through the
`openai` client) and counts, for one completion request per method, the calls made while it is
answered:
- lookups: `juice.methods.Registry.find` and `Registry.__getitem__` (every way a method's name
  reaches its registry entry);
- scans: the registry listed whole (`Registry.values`, `.items`, iteration: the request
  protocol's vocabularies, `juice.methods.protocol_names` and the like);
- parses: `steering_ask` as the server's admission calls it (the request's `juice` field read
  into a `juice.steering_request.SteeringAsk`).

Warm-up requests run first, so a count is what a request costs, not the first one's loading.

Run: python benchmarks/request_counts.py
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / d) for d in ("", "unit", "integration")]

ASKS = {
    "original": {"method": "original"},
    "juice": {"method": "juice", "beta_plus": 2.0, "beta_minus": -1.0},
    "june": {"method": "june", "beta_plus": 2.0, "beta_minus": -1.0},
    "ph3": {"method": "ph3", "heads": ["L0H1"]},
    "no field": None,
}


def main() -> None:
    from conftest import build_tiny
    from helpers.server import serving_client

    import juice
    from juice import methods
    from juice.apps.server import admission, create_app
    from juice.stage1 import HeadsArtifact

    counts: Counter[str] = Counter()

    def counted(owner, name: str, label: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            counts[label] += 1
            return original(*args, **kwargs)
        setattr(owner, name, wrapper)

    lm = build_tiny("llama")
    selection = juice.HeadSelection((juice.Head(1, 2),), (juice.Head(0, 1),))
    heads = HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], selection)
    counted(methods.Registry, "find", "lookups")
    counted(methods.Registry, "__getitem__", "lookups")
    for scan in ("values", "items", "__iter__"):
        counted(methods.Registry, scan, "scans")
    counted(admission, "steering_ask", "parses")
    rows = []
    with serving_client(create_app(lm, [heads], model_name="tiny")) as client:
        for name, ask in ASKS.items():
            body = {} if ask is None else {"extra_body": {"juice": ask}}
            for warm in (True, False):
                counts.clear()
                client.completions.create(model="tiny", prompt="the capital of france is", max_tokens=2,
                                          temperature=0, **body)
            rows.append((name, counts["lookups"], counts["scans"], counts["parses"]))
    print("| request's juice field | registry lookups by name | registry scans | steering parses |")
    print("|---|---|---|---|")
    for name, lookups, scans, parses in rows:
        print(f"| {name} | {lookups} | {scans} | {parses} |")


if __name__ == "__main__":
    main()
