"""`juice serve`'s playground (`GET /`, :data:`juice.apps.server.app.PLAYGROUND`): the page, the
`juice` view `GET /v1/models` gives it, and the page in a real browser (headless Chromium driven
by Playwright), whose texts must equal the API's for the requests the page sent."""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.request

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
from conftest import build_tiny  # noqa: E402
from helpers.request_protocol import serving  # noqa: E402

from juice.apps.server import create_app  # noqa: E402
from juice.interventions import Head, HeadSelection  # noqa: E402
from juice.stage1 import HeadsArtifact  # noqa: E402
from juice.steering import DEFAULT_BETAS  # noqa: E402

SEL = HeadSelection((Head(1, 2),), (Head(0, 1),))
TUNED = {"juice": {"beta_plus": 30.0, "beta_minus": -5.0}, "june": {"beta_plus": 4.0, "beta_minus": -2.0}}
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]   # no connection to another host is tried


@pytest.fixture(scope="module")
def served():
    """The playground's address on a server of the tiny Llama with one tuned contextual heads file."""
    lm = build_tiny("llama")
    artifact = HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL, tuned=TUNED)
    with serving(create_app(lm, [artifact], model_name="tiny", aliases={"tiny+juice": {"method": "juice"}})) as base:
        yield base.removesuffix("v1"), lm.geometry


def _get(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.headers["Content-Type"], response.read().decode("utf-8")


def _post(url: str, body: dict) -> tuple[dict, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read()), dict(response.headers)


def test_the_root_page_is_the_playground_and_loads_nothing_from_another_host(served):
    kind, page = _get(served[0])
    assert kind.startswith("text/html") and "<title>juice playground</title>" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "a script or style from another host"
    assert not re.search(r"""\b(import|fetch)\(\s*["'](https?:)?//""", page), "a request to another host"
    assert "fetch(\"v1/completions\"" in page and "fetch(\"v1/models\")" in page   # the server's own endpoints


def test_models_carry_the_head_grid_the_heads_and_their_tuned_betas(served):
    root, geometry = served
    _, text = _get(root + "v1/models")
    data = json.loads(text)["data"]
    assert [m["id"] for m in data] == ["tiny", "tiny+juice"]
    view = data[0]["juice"]
    assert view == data[1]["juice"]
    assert (view["layers"], view["heads_per_layer"]) == (geometry.n_layers, geometry.n_heads)
    assert view["default_betas"] == {"beta_plus": DEFAULT_BETAS[0], "beta_minus": DEFAULT_BETAS[1]}
    assert view["directions"] == {"contextual": {"positive": ["L1H2"], "negative": ["L0H1"], "tuned": TUNED}}


def _chromium() -> str | None:
    return os.environ.get("JUICE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def test_in_a_browser_the_three_texts_equal_the_apis_for_the_requests_the_page_sent(served):
    root, geometry = served
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is not installed")
    if _chromium() is None:
        pytest.skip("no Chromium here (Debian's package `chromium`; .ci/run installs it; or set JUICE_CHROMIUM)")
    passage, prompt = "w1 w2 w3", "the name of the capital city of spain is"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            sent: dict[str, dict] = {}
            page.on("request", lambda r: r.url.endswith("/v1/completions")
                    and sent.setdefault(r.post_data_json["juice"]["method"], r.post_data_json))
            page.goto(root)
            page.wait_for_selector("body[data-ready=true]", timeout=30_000)
            # the grid: every head a cell, the heads file's heads marked by sign
            assert page.locator("#grid td").count() == geometry.n_layers * geometry.n_heads
            assert page.locator("#grid td.positive").evaluate_all("cs => cs.map(c => c.dataset.head)") == ["L1H2"]
            assert page.locator("#grid td.negative").evaluate_all("cs => cs.map(c => c.dataset.head)") == ["L0H1"]
            page.fill("#passage", passage)
            page.fill("#prompt", prompt)
            page.fill("#max-tokens", "6")
            page.eval_on_selector("#strength", "s => { s.value = '0.5'; s.dispatchEvent(new Event('input')); }")
            page.click("#run")
            page.wait_for_function("document.querySelectorAll('.output[data-done]').length === 3", timeout=120_000)
            shown = {card.get_attribute("data-method"): card.locator(".text").text_content()
                     for card in page.locator(".output").all()}
            states = page.locator(".output").evaluate_all("cs => cs.map(c => c.dataset.done)")
        finally:
            browser.close()
    assert states == ["ok", "ok", "ok"] and set(shown) == set(sent) == {"original", "june", "juice"}
    assert sent["juice"]["juice"] == {"method": "juice", "direction": "contextual", "beta_plus": 15, "beta_minus": -2.5}
    assert sent["june"]["juice"] == {"method": "june", "direction": "contextual", "beta_plus": 2, "beta_minus": -1}
    assert sent["original"]["juice"] == {"method": "original"}
    for method, body in sent.items():   # the passage before the prompt, greedy, on the served model
        assert (body["prompt"], body["temperature"], body["max_tokens"], body["model"]) == (
            passage + " " + prompt, 0, 6, "tiny")
        reply, _ = _post(root + "v1/completions", body)
        assert shown[method] == reply["choices"][0]["text"], method
    assert len({shown["original"], shown["juice"]}) == 2   # the steering reached the page: not one text three times


def test_in_a_browser_a_server_without_heads_offers_original_only():
    """Without a heads file the page says so, draws no steered head and decodes Original alone."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is not installed")
    if _chromium() is None:
        pytest.skip("no Chromium here (Debian's package `chromium`; .ci/run installs it; or set JUICE_CHROMIUM)")
    lm = build_tiny("llama")
    with serving(create_app(lm, [], model_name="tiny")) as base, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(base.removesuffix("v1"))
            page.wait_for_selector("body[data-ready=true]", timeout=30_000)
            assert page.locator("#direction").is_disabled()
            assert page.locator("#grid td.positive, #grid td.negative").count() == 0
            assert "no heads file" in page.locator("#grid-note").text_content()
            page.fill("#prompt", "the capital of france is")
            page.fill("#max-tokens", "4")
            page.click("#run")
            page.wait_for_function("document.querySelectorAll('.output[data-done]').length === 1", timeout=60_000)
            cards = page.locator(".output").evaluate_all("cs => cs.map(c => [c.dataset.method, c.dataset.done])")
        finally:
            browser.close()
    assert cards == [["original", "ok"]]
