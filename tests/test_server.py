"""`juice serve` through the official `openai` client: models, completions, chat, streaming,
per-request steering, and a request's output independent of the rest of its batch."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
import openai  # noqa: E402
import uvicorn  # noqa: E402
from conftest import build_tiny  # noqa: E402

from juice.interventions import HeadSelection
from juice.stage1 import HeadsArtifact
from juice.interventions import Head  # noqa: E402
from juice.apps.server import create_app  # noqa: E402
from juice.steerer import Steerer  # noqa: E402

SEL = HeadSelection((Head(1, 2),), (Head(0, 1),))
PROMPTS = ["the capital of france is", "the name of the capital city of japan is",
           "w1 w2 w3 the name of the capital city of spain is", "the capital of germany is"]


@contextmanager
def _serving(app):
    """Run `app` on 127.0.0.1 at a free port in a thread; yield an `openai` client for it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    finally:
        server.should_exit = True
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def served():
    lm = build_tiny("llama")
    lm.tokenizer.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}is"
    artifact = HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL)
    app = create_app(lm, [artifact], model_name="tiny", batch_window_s=0.05)
    with _serving(app) as client:
        yield lm, client, app.state.engine


def test_a_tuned_heads_file_gives_the_default_betas(served):
    lm = served[0]
    tuned = {"juice": {"beta_plus": 30.0, "beta_minus": -5.0}, "june": {"beta_plus": 4.0, "beta_minus": -2.0}}
    artifact = HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL, tuned=tuned)
    with _serving(create_app(lm, [artifact], model_name="tiny")) as client:
        for method in ("juice", "june"):
            out = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0,
                                            extra_body={"juice": {"method": method}})
            assert out.choices[0].text == Steerer(lm, artifact, method=method).generate(PROMPTS[2], 6)[0]
        assert Steerer(lm, artifact).beta_plus == 30.0
        given = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0,
                                          extra_body={"juice": {"beta_plus": 1}})
        assert given.choices[0].text == Steerer(lm, SEL, beta_plus=1, beta_minus=-5).generate(PROMPTS[2], 6)[0]


def test_models_and_a_plain_completion_equal_the_library(served):
    lm, client, engine = served
    assert [m.id for m in client.models.list().data] == ["tiny"]
    out = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=6, temperature=0,
                                    extra_body={"juice": {"method": "original"}})
    assert out.choices[0].text == Steerer(lm, method="original").generate(PROMPTS[1], 6)[0]


def test_per_request_steering(served):
    lm, client, engine = served
    steered = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0, extra_body={
        "juice": {"direction": "context", "method": "juice", "beta_plus": 30, "beta_minus": -5}})
    assert steered.choices[0].text == Steerer(lm, SEL, method="juice", beta_plus=30, beta_minus=-5).generate(
        PROMPTS[2], 6)[0]
    # no juice field: this server's only heads, beta 2 and 0
    default = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0)
    assert default.choices[0].text == Steerer(lm, SEL, method="juice").generate(PROMPTS[2], 6)[0]
    with pytest.raises(openai.BadRequestError, match="no heads for direction"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"juice": {"direction": "memory"}})


def test_a_request_alone_and_among_fifteen_others_gives_the_same_tokens(served):
    lm, client, engine = served

    def ask(i: int):
        juice = [{"method": "original"}, {"method": "juice", "beta_plus": 3, "beta_minus": -1},
                 {"method": "june", "beta_plus": 1, "beta_minus": 0}][i % 3]
        return client.completions.create(model="tiny", prompt=PROMPTS[i % 4], max_tokens=5 + i % 3, temperature=0,
                                         extra_body={"juice": juice}).choices[0].text

    alone = ask(4)
    before = len(engine.batch_sizes)
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, range(16)))
    assert max(engine.batch_sizes[before:]) > 1   # requests really shared batches
    assert together[4] == alone
    assert together == [ask(i) for i in range(16)]   # every request, alone, gives what it got in the crowd


def test_chat_and_streaming(served):
    lm, client, engine = served
    messages = [{"role": "user", "content": "the capital of france"}]
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0,
                                          extra_body={"juice": {"method": "original"}})
    expected = Steerer(lm, method="original").generate("the capital of france is", 5)[0]
    assert chat.choices[0].message.content == expected
    pieces = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0, stream=True,
                                            extra_body={"juice": {"method": "original"}})
    assert "".join(c.choices[0].delta.content or "" for c in pieces) == expected
    streamed = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=6, temperature=0.8, seed=3,
                                         stream=True)
    sampled = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=6, temperature=0.8, seed=3)
    assert "".join(c.choices[0].text for c in streamed) == sampled.choices[0].text


def test_bad_requests_are_400s(served):
    _, client, _ = served
    with pytest.raises(openai.BadRequestError, match="method must be"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"juice": {"method": "both"}})
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=1.0, top_p=1.5)
    with pytest.raises(openai.BadRequestError, match=r"\|beta\| <= 100"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"juice": {"beta_plus": 1e6}})
    with pytest.raises(openai.BadRequestError, match="finite"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"juice": {"beta_minus": "nan"}})
    with pytest.raises(openai.BadRequestError, match="context holds"):
        client.completions.create(model="tiny", prompt="w1 " * 400, max_tokens=2, temperature=0)
