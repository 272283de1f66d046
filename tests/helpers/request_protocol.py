"""One table of request bodies for juice's request protocol (:mod:`juice.steering_request`),
sent to `juice serve` (tests/unit/test_steering_request.py) and to `juice serve --engine vllm`
(tests/integration/test_vllm.py), which must answer each with the same status, message and warning.

The servers are started with two heads files of a 3- or 4-layer, 4-head model: parametric
(:data:`PARAMETRIC`, JuNE tuned at 3, -0.5) and contextual (:data:`CONTEXTUAL`, untuned).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from hypothesis import strategies as st

from juice.interventions import Head, HeadSelection
from juice.stage1.heads_file import HeadsArtifact, save_heads

JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) |
                           st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=4), max_leaves=8)
"""Any JSON value (NaN and infinities included): the request-body fuzz of both servers."""
FUZZ_FIELDS = ["model", "prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stop",
               "seed", "repetition_penalty", "logprobs", "echo", "juice", "presence_penalty", "best_of", "user"]
"""The body fields the fuzz fills with :data:`JSON_VALUES`."""

PARAMETRIC = HeadSelection((Head(1, 0), Head(2, 3)), (Head(1, 2),))
CONTEXTUAL = HeadSelection((Head(2, 1),), (Head(1, 3), Head(2, 3)))
TUNED_PARAMETRIC = {"june": {"beta_plus": 3.0, "beta_minus": -0.5,
                             "beta_range": {"beta_plus": [0.0, 5.0], "beta_minus": [-3.0, 0.0]}}}

ABSENT = object()
"""A body without a `juice` field."""

BODIES: list[tuple[str, object, int, str | None, bool]] = [
    # (label, the juice field, status, a piece of the error message, a warning header?)
    ("no field: Original (two heads files)", ABSENT, 200, None, False),
    ("empty object: as no field", {}, 200, None, False),
    ("null: as no field", None, 200, None, False),
    ("original", {"method": "original"}, 200, None, False),
    ("case and direction alias", {"method": "JuNE", "direction": "Memory"}, 200, None, False),
    ("tuned JuNE betas by default", {"method": "june", "direction": "parametric"}, 200, None, False),
    ("untuned JuICE: defaults with a warning", {"method": "juice", "direction": "context"}, 200, None, True),
    ("one beta given, the other untuned", {"method": "juice", "direction": "context", "beta_plus": 1}, 200, None, True),
    ("both betas given", {"method": "juice", "direction": "contextual", "beta_plus": 1, "beta_minus": -1.5},
     200, None, False),
    ("integer and float betas", {"method": "june", "direction": "context", "beta_plus": 2, "beta_minus": 0.5},
     200, None, False),
    ("method absent: the tuned one", {"direction": "parametric"}, 200, None, False),
    ("a beta inside the range the file was tuned over", {"method": "june", "direction": "memory", "beta_plus": 5},
     200, None, False),
    ("a beta outside the range the file was tuned over: a warning",
     {"method": "june", "direction": "memory", "beta_plus": -5}, 200, None, True),
    ("method absent, untuned: JuICE", {"direction": "contextual"}, 200, None, True),
    ("ph3 with a list", {"method": "ph3", "heads": ["L1H1", "L2H0"]}, 200, None, False),
    ("ph3 with a string", {"method": "ph3", "heads": "L1H1, L2H0"}, 200, None, False),
    ("ph3 by its alias, any case", {"method": "Prune", "heads": ["L1H1"]}, 200, None, False),
    ("not an object", "juice", 400, "juice must be an object", False),
    ("a list", ["juice"], 400, "juice must be an object", False),
    ("unknown field", {"method": "juice", "beta": 1}, 400, "unknown juice field 'beta'", False),
    ("unknown method", {"method": "both"}, 400, "juice.method must be one of original, ph3, june, juice, auto",
     False),
    ("method not a string", {"method": 3}, 400, "juice.method must be one of", False),
    ("no direction on a two-file server", {"method": "juice"}, 400, "say juice.direction", False),
    ("unknown direction", {"method": "juice", "direction": "sideways"}, 400,
     "direction must be parametric (memory) or contextual (context)", False),
    ("direction not a string", {"method": "juice", "direction": 1}, 400, "juice.direction must be", False),
    ("boolean beta", {"method": "juice", "direction": "context", "beta_plus": True}, 400,
     "juice.beta_plus must be a number, not True", False),
    ("string beta", {"method": "june", "direction": "context", "beta_minus": "2"}, 400,
     "juice.beta_minus must be a number, not '2'", False),
    ("string beta, no direction on a two-file server", {"beta_plus": "abc"}, 400,
     "juice.beta_plus must be a number, not 'abc'", False),
    ("beta out of range", {"method": "june", "direction": "context", "beta_plus": 1e6}, 400, "|beta| <= 100", False),
    ("ph3 without heads", {"method": "ph3"}, 400, "needs juice.heads", False),
    ("ph3 with an empty list", {"method": "ph3", "heads": []}, 400, "needs juice.heads", False),
    ("ph3 with a head outside the model", {"method": "ph3", "heads": ["L9H0"]}, 400, "L9H0", False),
    ("ph3 with a bad head name", {"method": "ph3", "heads": ["layer1"]}, 400, "juice.heads:", False),
    ("heads with a direction", {"method": "june", "direction": "context", "heads": ["L1H1"]}, 400,
     "replaces the heads file's heads and betas", False),
    ("heads with auto", {"method": "auto", "heads": {"L1H1": 1}}, 400,
     "juice.heads is for methods ph3, june, juice", False),
    ("per-head JuNE coefficients", {"method": "june", "heads": {"L1H1": 0.5, "L2H0": -1}}, 200, None, False),
    ("per-head coefficients, the flat form", {"method": "june", "heads": ["L1H1=0.5", "L0H2=-1.0"]}, 200, None,
     False),
    ("per-head JuICE on a heads file's head", {"method": "juice", "heads": {"L1H0": 2, "L1H3": -1}}, 200, None,
     False),
    ("per-head coefficients with betas", {"method": "juice", "heads": {"L1H0": 2}, "beta_plus": 1}, 400,
     "send no direction or betas", False),
    ("per-head heads as names only", {"method": "june", "heads": ["L1H1"]}, 400,
     "takes juice.heads as an object of head names and coefficients", False),
    ("per-head coefficient not a number", {"method": "june", "heads": {"L1H1": "x"}}, 400,
     "juice.heads.L1H1 must be a number", False),
    ("per-head boolean coefficient", {"method": "june", "heads": {"L1H1": True}}, 400,
     "juice.heads.L1H1 must be a number", False),
    ("per-head coefficient out of range", {"method": "june", "heads": {"L1H1": 1000}}, 400, "|beta| <= 100", False),
    ("per-head head outside the model", {"method": "june", "heads": {"L9H0": 1}}, 400, "L9H0", False),
    ("per-head coefficients empty", {"method": "june", "heads": {}}, 400, "juice.heads is empty", False),
]


def write_heads_files(folder: Path, fingerprint: dict) -> list[str]:
    """The two heads files the table's servers run with (module docstring)."""
    paths = []
    for direction, selection, tuned in [("parametric", PARAMETRIC, TUNED_PARAMETRIC), ("contextual", CONTEXTUAL, {})]:
        path = folder / f"{direction}.json"
        save_heads(HeadsArtifact(fingerprint, direction, len(selection.positive), [1.0], [-1.0], selection,
                                 tuned=tuned), path)
        paths.append(str(path))
    return paths


def post(base_url: str, model: str, juice: object, prompt: list[int]) -> tuple[int, str | None, str | None]:
    """POST a completion with `juice` as its field; (status, error message or None, warning header or None)."""
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    if juice is not ABSENT:
        body["juice"] = juice
    request = urllib.request.Request(f"{base_url}/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, None, r.headers.get("X-Juice-Warning")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())["error"]["message"], err.headers.get("X-Juice-Warning")


def answers(base_url: str, model: str, prompt: list[int]) -> list[tuple[int, str | None, str | None]]:
    """The server's answer to every body of the table, in order."""
    return [post(base_url, model, juice, prompt) for _, juice, *_ in BODIES]


def check_table(got: list[tuple[int, str | None, str | None]]) -> None:
    """Every answer is the table's: status, a message holding the table's piece, a warning where expected."""
    for (label, _, status, piece, warns), (code, message, warning) in zip(BODIES, got, strict=True):
        assert code == status, (label, code, message)
        if piece is not None:
            assert message is not None and piece in message, (label, message)
        assert (warning is not None) == warns, (label, warning)


@contextmanager
def serving(app):
    """Run an ASGI `app` on 127.0.0.1 at a free port in a thread; yield its base URL (`.../v1`)."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=5)
