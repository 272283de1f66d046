"""`juice serve` through the official `openai` client: models, completions, chat, streaming,
per-request steering, and a request's output independent of the rest of its batch."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
import openai  # noqa: E402
from conftest import build_tiny  # noqa: E402

from juice.interventions import HeadSelection
from juice.stage1 import HeadsArtifact
from juice.interventions import Head  # noqa: E402
from juice.apps.server import WARNING_HEADER, create_app, parse_spec  # noqa: E402
from juice.steerer import Steerer  # noqa: E402
from helpers.server import serving_client  # noqa: E402
from juice.steering import UntunedBetasWarning  # noqa: E402

pytestmark = pytest.mark.gpu   # benchmarks/gpu_check.py runs these on the device

SEL = HeadSelection((Head(1, 2),), (Head(0, 1),))
PROMPTS = ["the capital of france is", "the name of the capital city of japan is",
           "w1 w2 w3 the name of the capital city of spain is", "the capital of germany is"]


@pytest.fixture(scope="module")
def served():
    lm = build_tiny("llama")
    lm.tokenizer.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}is"
    artifact = HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL)
    app = create_app(lm, [artifact], model_name="tiny")
    with serving_client(app) as client:
        yield lm, client, app.state.worker


def test_a_tuned_heads_file_gives_the_default_betas(served):
    lm = served[0]
    tuned = {"juice": {"beta_plus": 30.0, "beta_minus": -5.0}, "june": {"beta_plus": 4.0, "beta_minus": -2.0}}
    artifact = HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL, tuned=tuned)
    with serving_client(create_app(lm, [artifact], model_name="tiny")) as client:
        for method in ("juice", "june"):
            out = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0,
                                            extra_body={"juice": {"method": method}})
            assert out.choices[0].text == Steerer(lm, artifact, method=method).generate(PROMPTS[2], 6)[0]
        assert Steerer(lm, artifact).beta_plus == 30.0
        given = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0,
                                          extra_body={"juice": {"beta_plus": 1}})
        assert given.choices[0].text == Steerer(lm, SEL, beta_plus=1, beta_minus=-5).generate(PROMPTS[2], 6)[0]
        # no juice field: the tuned steering (JuICE at 30, -5), no warning
        plain = client.completions.with_raw_response.create(model="tiny", prompt=PROMPTS[2], max_tokens=6,
                                                            temperature=0)
        assert plain.parse().choices[0].text == Steerer(lm, artifact).generate(PROMPTS[2], 6)[0]
        assert WARNING_HEADER not in plain.headers
    only_june = HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL, tuned={"june": tuned["june"]})
    with serving_client(create_app(lm, [only_june], model_name="tiny")) as client:   # JuNE is what was tuned
        out = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0)
        assert out.choices[0].text == Steerer(lm, only_june, method="june").generate(PROMPTS[2], 6)[0]


def test_an_operators_default_steers_requests_without_a_juice_field(served):
    lm = served[0]
    artifact = HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL)
    app = create_app(lm, [artifact], model_name="tiny", default=parse_spec("method:june,beta_plus:3,beta_minus:-1"))
    with serving_client(app) as client:
        out = client.completions.with_raw_response.create(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0)
        assert out.parse().choices[0].text == Steerer(lm, SEL, method="june", beta_plus=3, beta_minus=-1).generate(
            PROMPTS[2], 6)[0]
        assert WARNING_HEADER not in out.headers   # both betas given
    with pytest.raises(ValueError, match="--default: juice.method must be"):
        create_app(lm, [artifact], default={"method": "jucie"})


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
    # no juice field and an untuned heads file: Original (issue 38), no warning
    plain = client.completions.with_raw_response.create(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0)
    assert plain.parse().choices[0].text == Steerer(lm, method="original").generate(PROMPTS[2], 6)[0]
    assert WARNING_HEADER not in plain.headers
    # asking for steering without betas: JuICE at the untuned 2 and 0, with a warning naming juice tune
    with pytest.warns(UntunedBetasWarning):
        expected = Steerer(lm, SEL, method="juice").generate(PROMPTS[2], 6)[0]
    for stream in (False, True):
        raw = client.completions.with_raw_response.create(model="tiny", prompt=PROMPTS[2], max_tokens=6,
                                                          temperature=0, stream=stream,
                                                          extra_body={"juice": {"direction": "context"}})
        out = raw.parse()
        text = "".join(c.choices[0].text for c in out) if stream else out.choices[0].text
        assert text == expected
        assert "untuned betas (beta_plus=2, beta_minus=0)" in raw.headers[WARNING_HEADER]
        assert "juice tune" in raw.headers[WARNING_HEADER]
    with pytest.raises(openai.BadRequestError, match="no heads for direction"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"juice": {"direction": "memory"}})


def test_vllm_xargs_juice_keys_steer_as_the_juice_field_and_beam_search_is_refused(served):
    """Issue 74: `juice serve` answers vLLM's request forms as vLLM with juice's plugin does, never
    ignoring them: `juice_*` keys in `vllm_xargs` steer as the `juice` field (and override it key
    by key), an unknown one is a 400, and `use_beam_search` is a 400 (juice serve has no beam
    search). Its routes: POST /v1/completions and /v1/chat/completions generate; any other POST is
    a 404 in OpenAI's shape."""
    lm, client, engine = served
    asked = {"direction": "context", "method": "juice", "beta_plus": 30, "beta_minus": -5}
    expected = Steerer(lm, SEL, method="juice", beta_plus=30, beta_minus=-5).generate(PROMPTS[2], 6)[0]
    flat = {"vllm_xargs": {f"juice_{k}": v for k, v in asked.items()}}
    for extra in (flat, {"juice": {**asked, "beta_plus": 1}, "vllm_xargs": {"juice_beta_plus": 30}}):
        out = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0,
                                        extra_body=extra)
        assert out.choices[0].text == expected
    with pytest.raises(openai.BadRequestError, match="unknown juice field 'beta'"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"vllm_xargs": {"juice_beta": 1}})
    for create, body in ((client.completions.create, {"prompt": "x"}),
                         (client.chat.completions.create, {"messages": [{"role": "user", "content": "x"}]})):
        with pytest.raises(openai.BadRequestError, match="use_beam_search is not implemented"):
            create(model="tiny", max_tokens=2, **body, extra_body={"use_beam_search": True, "juice": asked})
    port = _port(client)
    for path in ("/v1/responses", "/v1/messages", "/v1/chat/completions/batch", "/invocations"):
        status, data, _ = _post(port, path, {"model": "tiny", "input": "x", "juice": asked})
        assert status == 404 and data["error"]["message"] and data["error"]["type"]


def test_a_request_alone_and_among_fifteen_others_gives_the_same_tokens(served):
    lm, client, engine = served

    def ask(i: int):
        juice = [{"method": "original"}, {"method": "juice", "beta_plus": 3, "beta_minus": -1},
                 {"method": "june", "beta_plus": 1, "beta_minus": 0}][i % 3]
        return client.completions.create(model="tiny", prompt=PROMPTS[i % 4], max_tokens=5 + i % 3, temperature=0,
                                         extra_body={"juice": juice}).choices[0].text

    alone = ask(4)
    engine.reset_peak()
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, range(16)))
    assert engine.peak_streams > 1   # requests really shared steps
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
    with pytest.raises(openai.BadRequestError, match="must be a number, not 'nan'"):   # strings are not numbers
        client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"juice": {"beta_minus": "nan"}})
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256 tokens"):
        client.completions.create(model="tiny", prompt="w1 " * 400, max_tokens=2, temperature=0)


# -- scheduling, cancellation, limits, errors, metrics (issue 24) ------------------------------

import http.client  # noqa: E402
import json  # noqa: E402
import socket as _socket  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from juice.apps.openai_schema import ServerLimits  # noqa: E402
from juice.engine import Stream, generate  # noqa: E402

LONG_PROMPT = "the name of the capital city of japan is"   # no EOS in 230 greedy tokens of the tiny llama


def _port(client) -> int:
    return int(str(client.base_url).rstrip("/").split(":")[-1].split("/")[0])


def _post(port: int, path: str, body, raw: bool = False) -> tuple[int, dict, dict]:
    """POST `body` (JSON, or bytes if `raw`); (status, parsed body or the SSE events, headers)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", path, body if raw else json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    if r.getheader("content-type", "").startswith("text/event-stream"):
        events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data: {")]
        return r.status, {"events": events}, dict(r.getheaders())
    return r.status, json.loads(text) if text else {}, dict(r.getheaders())


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    return r.status, text


def _metric(port: int, name: str) -> float:
    _, text = _get(port, "/metrics")
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ") or
              line.startswith(name + "{")]
    return sum(values)


def _until(condition, what: str, seconds: float = 60) -> None:
    """Wait until `condition()` holds (not a timing assertion: a deadline for a hung server)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.005)


def _alone_text(lm, prompt: str, n: int, steering=None) -> str:
    stream = Stream(0) if steering is None else Stream(0, steering)
    return generate(lm, [prompt], [stream], n, stop_at_eos=True).texts[0]


def test_short_requests_join_a_long_one_and_finish_first_with_their_tokens_alone(served):
    lm, client, engine = served
    long_done = threading.Event()
    long_text = {}

    def long():
        out = client.completions.create(model="tiny", prompt=LONG_PROMPT, max_tokens=220, temperature=0,
                                        extra_body={"juice": {"method": "original"}})
        long_text["t"] = out.choices[0].text
        long_done.set()

    threading.Thread(target=long).start()
    _until(lambda: engine.running >= 1, "the long request to start")
    juice = [{"method": "original"}, {"method": "juice", "beta_plus": 3, "beta_minus": -1},
             {"method": "june", "beta_plus": 1, "beta_minus": 0}]

    def short(i: int) -> str:
        return client.completions.create(model="tiny", prompt=PROMPTS[i % 4], max_tokens=4 + i % 3, temperature=0,
                                         extra_body={"juice": juice[i % 3]}).choices[0].text

    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(short, range(6)))
    assert not long_done.is_set()   # answered while the long request still decodes
    long_done.wait(120)
    assert long_text["t"] == _alone_text(lm, LONG_PROMPT, 220)
    engine.reset_peak()
    assert together == [short(i) for i in range(6)]


def test_a_request_over_the_token_limit_is_refused_at_once_while_another_is_served():
    """Issue 92: one huge request (100,000 characters) is refused with a 400 in OpenAI's shape by
    the per-request token limit (`juice serve --max-request-tokens`), before it takes a row, while
    a request under the limit is decoding; that one still gets its tokens alone."""
    from juice.apps.openai_schema import ServerLimits

    lm = build_tiny("llama")
    app = create_app(lm, [], model_name="tiny", limits=ServerLimits(max_request_tokens=300))
    with serving_client(app) as client:
        engine, port = app.state.worker, _port(client)
        done, text = threading.Event(), {}

        def under():   # 9 prompt tokens + 220 to generate: admitted
            out = client.completions.create(model="tiny", prompt=LONG_PROMPT, max_tokens=220, temperature=0)
            text["t"] = out.choices[0].text
            done.set()

        threading.Thread(target=under).start()
        _until(lambda: engine.running >= 1, "the request under the limit to start")
        huge = " ".join(["w1"] * 50_000)   # 100,000 characters
        status, data, _ = _post(port, "/v1/completions", {"model": "tiny", "prompt": huge, "max_tokens": 4})
        assert status == 400 and set(data["error"]) == {"message", "type", "param", "code"}
        assert data["error"]["type"] == "invalid_request_error" and data["error"]["code"] == "request_too_large"
        assert "at most 300 per request (its --max-request-tokens)" in data["error"]["message"]
        assert "\n" not in data["error"]["message"]
        # the limit counts the tokens to generate too: every choice of every prompt
        status, data, _ = _post(port, "/v1/completions", {"model": "tiny", "prompt": ["x", "y"], "n": 2,
                                                          "max_tokens": 100})
        assert status == 400 and "2 prompt(s) x n=2 x max_tokens=100" in data["error"]["message"]
        assert not done.is_set() and engine.session.rows == 1   # refused while the other decodes, never batched
        done.wait(120)
        assert text["t"] == _alone_text(lm, LONG_PROMPT, 220)


def test_an_abandoned_stream_and_a_closed_connection_leave_the_batch(served):
    lm, client, engine = served
    port = _port(client)
    cancelled = _metric(port, 'juice_requests_total{outcome="cancelled"}')
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": LONG_PROMPT, "max_tokens": 220,
                                                        "temperature": 0, "stream": True,
                                                        "juice": {"method": "original"}}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    while not response.readline().startswith(b"data: {"):
        pass
    _until(lambda: engine.session.rows == 1, "the stream's row")
    conn.sock.shutdown(_socket.SHUT_RDWR)
    conn.close()   # the client goes away after its first chunk
    _until(lambda: engine.session.rows == 0 and engine.running == 0, "the abandoned stream's row to be freed")
    assert _metric(port, 'juice_requests_total{outcome="cancelled"}') == cancelled + 1
    # a plain request whose client closes the connection before the answer
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": LONG_PROMPT, "max_tokens": 220,
                                                        "temperature": 0, "juice": {"method": "original"}}),
                 {"Content-Type": "application/json"})
    _until(lambda: engine.session.rows == 1, "the request's row")
    conn.sock.shutdown(_socket.SHUT_RDWR)
    conn.close()
    _until(lambda: engine.session.rows == 0, "the closed request's row to be freed")
    assert _metric(port, 'juice_requests_total{outcome="cancelled"}') == cancelled + 2
    assert client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=3, temperature=0).choices


def test_errors_have_openai_shape_and_the_server_keeps_serving(served):
    lm, client, engine = served
    port = _port(client)
    cases = [  # body -> (status, a piece of the message)
        ({"model": "gpt-4", "prompt": "x"}, 404, "The model `gpt-4` does not exist."),
        ({"model": "tiny", "prompt": "x", "temperature": -1}, 400, "temperature: Input should be greater than or equal to 0"),
        ({"model": "tiny", "prompt": "x", "top_p": 0}, 400, "top_p"),
        ({"model": "tiny", "prompt": "x", "n": 1000}, 400, "n must be at most 16"),
        ({"model": "tiny", "prompt": "x", "logprobs": 21}, 400, "logprobs: Input should be less than or equal to 20"),
        ({"model": "tiny", "prompt": "x", "logprobs": -1}, 400, "logprobs"),
        ({"model": "tiny", "prompt": "x", "logprobs": 1, "stream": True}, 400, "not available with stream"),
        ({"model": "tiny", "prompt": [1, 5, 100000]}, 400, "token id 100000 is out of range"),
        ({"model": "tiny", "prompt": []}, 400, "prompt"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "logprobs": True}, 400,
         "not implemented for chat"),
        ({"model": "tiny", "prompt": "x", "max_tokens": 100000000}, 400,
         "maximum context length is 256 tokens. However, you requested 100000002 tokens"),
        ({"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "0 only with echo"),
        ({"model": "tiny", "prompt": 5}, 400, "prompt"),
        ({"model": "tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "at most 4 stop strings"),
        ({"model": "tiny", "prompt": "x", "juice": {"method": "both"}}, 400, "juice.method must be"),
        ({"model": "tiny", "prompt": "x", "seed": -3}, 400, "seed"),
        ({"model": "tiny", "messages": []}, 400, "messages"),
        ([1, 2], 400, "JSON object"),
    ]
    for body, status, message in cases:
        path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
        got, data, _ = _post(port, path, body)
        assert got == status and set(data["error"]) == {"message", "type", "param", "code"}, (body, data)
        assert message in data["error"]["message"], (body, data)
    got, data, _ = _post(port, "/v1/completions", b'{"model": "tiny", "prompt": ', raw=True)
    assert got == 400 and data["error"]["message"].startswith("malformed JSON")
    got, data, _ = _post(port, "/v1/completions", {"model": "gpt-4", "prompt": "x"})   # OpenAI's own shape
    assert data["error"] == {"message": "The model `gpt-4` does not exist. This server serves tiny (GET /v1/models).",
                             "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
    got, data, _ = _post(port, "/v1/nothing", {})
    assert got == 404 and data["error"]["type"] == "invalid_request_error" and data["error"]["code"] == "unknown_url"
    assert data["error"]["message"].startswith("Invalid URL (POST /v1/nothing)")
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    assert _get(port, "/health") == (200, '{"status":"ok"}')
    assert client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=3, temperature=0).choices


def test_past_the_queue_a_request_gets_429_and_every_admitted_one_is_answered():
    lm = build_tiny("llama")
    app = create_app(lm, model_name="tiny", limits=ServerLimits(max_rows=1, max_queued=1))
    engine = app.state.worker
    with serving_client(app) as client:
        port = _port(client)
        answers = {}

        def ask(key: str, prompt: str) -> None:
            answers[key] = _post(port, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 220,
                                                           "temperature": 0})

        first = threading.Thread(target=ask, args=("first", LONG_PROMPT))
        first.start()
        _until(lambda: engine.running == 1, "the first request to run")
        second = threading.Thread(target=ask, args=("second", "x"))
        second.start()
        _until(lambda: engine.waiting == 1, "the second request to wait (the batch holds one row)")
        status, data, headers = _post(port, "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert status == 429 and data["error"]["code"] == "rate_limit_exceeded" and headers["retry-after"] == "1"
        first.join(120)
        second.join(120)
        assert answers["first"][0] == answers["second"][0] == 200
        assert answers["first"][1]["choices"][0]["text"] == _alone_text(lm, LONG_PROMPT, 220)
        assert answers["second"][1]["choices"][0]["text"] == _alone_text(lm, "x", 220)
        assert _metric(port, 'juice_requests_total{outcome="rejected_429"}') == 1


def test_a_request_past_its_timeout_is_a_504_and_a_stream_gets_an_error_event():
    lm = build_tiny("llama")
    app = create_app(lm, model_name="tiny", limits=ServerLimits(request_timeout_s=0.05))
    with serving_client(app) as client:
        port = _port(client)
        body = {"model": "tiny", "prompt": LONG_PROMPT, "max_tokens": 220, "temperature": 0}
        status, data, _ = _post(port, "/v1/completions", body)
        assert status == 504 and "longer than 0.05 s" in data["error"]["message"]
        status, data, _ = _post(port, "/v1/completions", {**body, "stream": True})
        assert status == 200 and "longer than 0.05 s" in data["events"][-1]["error"]["message"]
        deadline = time.monotonic() + 10   # the engine drops the stream at its next step, after the event is sent
        while app.state.worker.session.rows and time.monotonic() < deadline:
            time.sleep(0.01)
        assert app.state.worker.session.rows == 0


def test_metrics_are_prometheus_text(served):
    lm, client, engine = served
    port = _port(client)
    before = _metric(port, "juice_generation_tokens_total")
    out = client.completions.create(model="tiny", prompt=LONG_PROMPT, max_tokens=7, temperature=0)
    assert out.usage.completion_tokens == 7
    _, text = _get(port, "/metrics")
    for name in ("juice_requests_running", "juice_requests_waiting", "juice_generation_tokens_total",
                 "juice_generation_tokens_per_second", "juice_request_latency_seconds_bucket",
                 "juice_time_to_first_token_seconds_count", "juice_batch_rows"):
        assert f"\n{name}" in text, name
    assert _metric(port, "juice_generation_tokens_total") == before + 7


def test_a_stream_with_n_choices_equals_the_plain_answer(served):
    lm, client, engine = served
    body = dict(model="tiny", prompt=PROMPTS[1], max_tokens=6, temperature=0.9, seed=11, n=3)
    plain = client.completions.create(**body)
    pieces = ["", "", ""]
    reasons = [None] * 3
    for c in client.completions.create(**body, stream=True):
        pieces[c.choices[0].index] += c.choices[0].text
        reasons[c.choices[0].index] = c.choices[0].finish_reason or reasons[c.choices[0].index]
    assert pieces == [c.text for c in plain.choices] and reasons == [c.finish_reason for c in plain.choices]


from helpers.request_protocol import FUZZ_FIELDS as FIELDS  # noqa: E402
from helpers.request_protocol import JSON_VALUES  # noqa: E402


@pytest.fixture(scope="module")
def fuzzed():
    lm = build_tiny("llama")
    lm.tokenizer.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}is"
    app = create_app(lm, [HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL)], model_name="tiny",
                     limits=ServerLimits(max_prompts=3, max_total_tokens=24, max_n=3))
    with serving_client(app) as client:
        yield _port(client)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.fixed_dictionaries({}, optional={f: JSON_VALUES for f in FIELDS}),
       chat=st.booleans(), valid=st.sampled_from(["", "model", "prompt", "both"]))
def test_fuzzed_request_bodies_never_get_a_500(fuzzed, body, chat, valid):
    if valid in ("model", "both"):
        body["model"] = "tiny"
    if valid in ("prompt", "both"):
        body["messages" if chat else "prompt"] = [{"role": "user", "content": "a b"}] if chat else "a b"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    status, data, _ = _post(fuzzed, path, json.dumps(body, allow_nan=True).encode(), raw=True)
    assert status in (200, 400, 404), (body, status, data)
    if status != 200:
        assert set(data["error"]) == {"message", "type", "param", "code"}
    assert _get(fuzzed, "/health")[0] == 200


# -- logprobs, echo, token-id prompts, aliases (issue 21) ----------------------------------------

import torch  # noqa: E402

from juice.steering import JuICE, JuNE  # noqa: E402
from juice.tokens import token_ids  # noqa: E402


def _forced(lm, ids: list[int], steering) -> list[float]:
    """Log-probabilities of ids[1:] after ids[0] under `steering`, by the cached engine's teacher
    forcing (`generate(forced_tokens=...)`, another code path than the server's echo)."""
    assert ids[0] == lm.tokenizer.bos_token_id
    gen = generate(lm, [""], [Stream(0, steering)], len(ids) - 1, forced_tokens=torch.tensor([ids[1:]]))
    return gen.forced_logprobs[0].tolist()


def test_echo_logprobs_equal_teacher_forcing_and_hugging_face(served):
    lm, client, engine = served
    prompt = PROMPTS[2]
    ids = token_ids(lm.tokenizer, prompt)
    hf = lm.model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    want_hf = hf[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
    for juice, steering in [({"method": "original"}, None), ({"method": "juice", "beta_plus": 3, "beta_minus": -1},
                                                              JuICE(lm, SEL, 3, -1)),
                            ({"method": "june", "beta_plus": 1, "beta_minus": -0.5}, JuNE(lm, SEL, 1, -0.5))]:
        out = client.completions.create(model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=3,
                                        temperature=0, extra_body={"juice": juice})
        lp = out.choices[0].logprobs
        assert out.choices[0].text == prompt and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert len(lp.tokens) == len(ids) and lp.text_offset[:2] == [0, 0]   # BOS is not in the text
        assert all(prompt[at:at + len(t)] == t for t, at in zip(lp.tokens[1:], lp.text_offset[1:]))
        want = want_hf if steering is None else _forced(lm, ids, steering)
        assert torch.allclose(torch.tensor(lp.token_logprobs[1:]), torch.tensor(want), atol=1e-4), juice
        for chosen, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]):
            values = list(top.values())
            assert len(top) <= 3 and values == sorted(values, reverse=True) and chosen <= values[0] + 1e-6


def test_generated_logprobs_are_the_steered_models_and_greedy_tokens_are_its_top(served):
    lm, client, engine = served
    steering = JuICE(lm, SEL, 3, -1)
    out = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=6, logprobs=2, temperature=0,
                                    extra_body={"juice": {"method": "juice", "beta_plus": 3, "beta_minus": -1}})
    lp = out.choices[0].logprobs
    alone = generate(lm, [PROMPTS[1]], [Stream(0, steering)], 6, stop_at_eos=True).tokens[0].tolist()
    eos = lm.tokenizer.eos_token_id
    new = alone[: alone.index(eos) + 1] if eos in alone else alone
    assert lp.tokens == [lm.tokenizer.decode([t]) for t in new]
    want = _forced(lm, token_ids(lm.tokenizer, PROMPTS[1]) + new, steering)[-len(new):]
    assert torch.allclose(torch.tensor(lp.token_logprobs), torch.tensor(want), atol=1e-4)
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen == max(top.values())   # greedy: the chosen token is the most probable (lm-eval's is_greedy)
    # lm-evaluation-harness's loglikelihood request: token ids, a batch of prompts, max_tokens 1, echo, logprobs 1
    batch = [token_ids(lm.tokenizer, p) for p in PROMPTS[:3]]
    both = client.completions.create(model="tiny", prompt=batch, max_tokens=1, echo=True, logprobs=1, temperature=0,
                                     extra_body={"juice": {"method": "original"}})
    assert [c.index for c in both.choices] == [0, 1, 2]
    for ids, text, c in zip(batch, PROMPTS, both.choices):
        single = client.completions.create(model="tiny", prompt=text, max_tokens=1, echo=True, logprobs=1,
                                           temperature=0, extra_body={"juice": {"method": "original"}})
        got, want = c.logprobs.token_logprobs, single.choices[0].logprobs.token_logprobs   # token ids = text
        assert got[0] is want[0] is None and torch.allclose(torch.tensor(got[1:]), torch.tensor(want[1:]), atol=1e-5)
        assert c.text == single.choices[0].text and len(c.logprobs.tokens) == len(ids) + 1


def test_an_alias_steers_the_requests_that_name_it(served):
    lm = served[0]
    artifact = HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL)
    alias = {"tiny+juice": {"method": "juice", "beta_plus": 3.0, "beta_minus": -1.0}}
    with serving_client(create_app(lm, [artifact], model_name="tiny", aliases=alias)) as client:
        assert [m.id for m in client.models.list().data] == ["tiny", "tiny+juice"]
        by_alias = client.completions.create(model="tiny+juice", prompt=PROMPTS[2], max_tokens=6, temperature=0)
        assert by_alias.model == "tiny+juice"
        assert by_alias.choices[0].text == Steerer(lm, SEL, method="juice", beta_plus=3, beta_minus=-1).generate(
            PROMPTS[2], 6)[0]
        overridden = client.completions.create(model="tiny+juice", prompt=PROMPTS[2], max_tokens=6, temperature=0,
                                               extra_body={"juice": {"beta_plus": 1}})
        assert overridden.choices[0].text == Steerer(lm, SEL, method="juice", beta_plus=1, beta_minus=-1).generate(
            PROMPTS[2], 6)[0]
    with pytest.raises(ValueError, match="alias 'bad': no heads for direction 'parametric'"):
        create_app(lm, [artifact], model_name="tiny", aliases={"bad": {"direction": "memory"}})
    with pytest.raises(ValueError, match="alias 'typo': unknown juice field 'bta_plus'"):   # read once, at start
        create_app(lm, [artifact], model_name="tiny", aliases={"typo": {"bta_plus": 1}})
    with pytest.raises(ValueError, match="--default: unknown juice field 'metod'"):
        create_app(lm, [artifact], model_name="tiny", default={"metod": "june"})


def test_alias_specs_parse_or_say_why():
    from juice.apps.server import parse_alias

    assert parse_alias("g+juice=direction:contextual,method:juice,beta_plus:2") == (
        "g+juice", {"direction": "contextual", "method": "juice", "beta_plus": 2.0})
    assert parse_alias("plain=") == ("plain", {})
    for bad, message in [("noequals", "NAME=key:value"), ("a=method", "is not key:value"),
                         ("a=beta_plus:big", "beta_plus must be a number")]:
        with pytest.raises(ValueError, match=message):
            parse_alias(bad)


def test_auto_serves_each_request_as_the_steerer_with_its_question():
    """`"method": "auto"` with `juice.question`: the completion and the chat equal the Steerer's
    auto, batched with other requests; a request without a question, with betas, or to a file
    without a policy gets a one-line 400."""
    from juice.when_to_steer.auto import AutoPolicy

    lm = build_tiny("llama")
    lm.tokenizer.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}is"
    policy = AutoPolicy((0.01,), ("original", "juice"), {"juice": (3.0, -1.0)})
    tuned = {"juice": {"beta_plus": 3.0, "beta_minus": -1.0}, "auto": policy.to_json()}
    artifact = HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL, tuned=tuned)
    steerer = Steerer(lm, artifact, method="auto")
    contexts = ["the capital of france is rome .", "w1 w2 w3 w4 w5"]
    asked = [(f"{contexts[i % 2]} {PROMPTS[i]}", PROMPTS[i]) for i in range(4)]
    wanted = [steerer.generate(prompt, 6, questions=question)[0] for prompt, question in asked]
    assert len(set(wanted)) > 1
    messages = [{"role": "user", "content": f"{contexts[0]} {PROMPTS[0]}"}]
    chat_wanted = steerer.chat(messages, 6, question=PROMPTS[0])
    with serving_client(create_app(lm, [artifact], model_name="tiny")) as client:
        def ask(i):
            prompt, question = asked[i]
            out = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                            extra_body={"juice": {"method": "auto", "question": question}})
            return out.choices[0].text

        with ThreadPoolExecutor(4) as pool:   # batched with each other
            assert list(pool.map(ask, range(4))) == wanted
        chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                              extra_body={"juice": {"method": "auto", "question": PROMPTS[0]}})
        assert chat.choices[0].message.content == chat_wanted
        for juice_field, message in [({"method": "auto"}, "needs juice.question"),
                                     ({"method": "auto", "question": "q", "beta_plus": 1}, "send no betas"),
                                     ({"method": "juice", "question": "q"}, "juice.question is for method auto")]:
            with pytest.raises(openai.BadRequestError, match=message):
                client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=2, extra_body={"juice": juice_field})
    # a policy that picks the Prompt baseline toward memory: the instructed prompt, as the Steerer's
    prompt_policy = AutoPolicy((), ("prompt-mem",))
    instructed = HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL,
                               tuned={"auto": prompt_policy.to_json()})
    steerer = Steerer(lm, instructed, method="auto")
    wanted = [steerer.generate(prompt, 6, questions=question)[0] for prompt, question in asked]
    chat_wanted = steerer.chat(messages, 6, question=PROMPTS[0])
    assert wanted[0] != Steerer(lm, instructed, method="original").generate(asked[0][0], 6)[0]
    with serving_client(create_app(lm, [instructed], model_name="tiny")) as client:
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(ask, range(4))) == wanted
        chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                              extra_body={"juice": {"method": "auto", "question": PROMPTS[0]}})
        assert chat.choices[0].message.content == chat_wanted
    untuned = HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL)
    with serving_client(create_app(lm, [untuned], model_name="tiny")) as client:
        with pytest.raises(openai.BadRequestError, match="holds no auto policy"):
            client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=2,
                                      extra_body={"juice": {"method": "auto", "question": "q"}})
