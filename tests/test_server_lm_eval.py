"""lm-evaluation-harness (`local-completions`) against `juice serve`, on the embedded Gemma 3 270M:
a multiple-choice MemoTrap task whose accuracy equals juice's own likelihood metric on the same
items, and a generate-until NQ-Swap task whose exact match (the harness's side: a SQuAD-style
normalization written here, not juice's) equals juice's, with the same outputs, for Original
and for JuICE chosen by a served-model alias. The tasks are local YAMLs over ../shared/data
(the harness cannot download here)."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

pytest.importorskip("fastapi")
lm_eval = pytest.importorskip("lm_eval")
from conftest import SHARED  # noqa: E402
from test_server import _serving  # noqa: E402

from juice.apps.server import create_app  # noqa: E402
from juice.data.memotrap import load_memotrap  # noqa: E402
from juice.data.nqswap import load_nqswap  # noqa: E402
from juice.eval.runner import evaluate_contextual, likelihood_wins  # noqa: E402
from juice.interventions import Head, HeadSelection  # noqa: E402
from juice.stage1 import HeadsArtifact  # noqa: E402
from juice.steering import ORIGINAL, JuICE  # noqa: E402

pytestmark = pytest.mark.slow
MEMOTRAP = SHARED / "data" / "memotrap" / "1-proverb-ending.csv"
NQSWAP = SHARED / "data" / "nqswap" / "nqswap.jsonl"
N_MEMOTRAP, N_NQSWAP = 8, 4
# the README's Table 1 heads; any selection serves to compare two implementations of the metrics
HEADS = HeadSelection(tuple(map(Head.parse, "L6H3 L10H0 L8H2 L8H3 L9H3".split())),
                      tuple(map(Head.parse, "L8H0 L3H3 L13H2 L16H3 L10H1".split())))
JUICE = {"direction": "contextual", "method": "juice", "beta_plus": 2.0, "beta_minus": -1.0}

UTILS = '''
import re
import string


def _normalize(text):   # SQuAD's answer normalization
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\\b(a|an|the)\\b", " ", text)
    return " ".join(text.split())


def process_results(doc, results):
    output = _normalize(results[0])
    return {"exact_match": float(any(_normalize(a) and _normalize(a) in output for a in doc["answers"]))}
'''


@pytest.fixture(scope="module")
def harness(real_model, tmp_path_factory):
    """(lm, port, task folder, tokenizer folder): the embedded Gemma served with an alias."""
    if not MEMOTRAP.is_file() or not NQSWAP.is_file():
        pytest.skip(f"MemoTrap / NQ-Swap data not found under {SHARED / 'data'}")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    lm = real_model
    folder = tmp_path_factory.mktemp("tasks")
    tokenizer = tmp_path_factory.mktemp("tokenizer")
    lm.tokenizer.save_pretrained(tokenizer)
    (folder / "memotrap.yaml").write_text(textwrap.dedent(f"""\
        task: juice_memotrap
        dataset_path: csv
        dataset_kwargs:
          data_files:
            test: {MEMOTRAP}
        test_split: test
        output_type: multiple_choice
        doc_to_text: "{{{{prompt}}}}"
        doc_to_choice: "{{{{classes}}}}"
        doc_to_target: answer_index
        target_delimiter: ""
        metric_list:
          - metric: acc
            aggregation: mean
            higher_is_better: true
        """))
    rows = [{"prompt": ex.prompt, "answers": list(ex.context_answers)} for ex in load_nqswap(NQSWAP)[:N_NQSWAP]]
    (folder / "nqswap.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "utils.py").write_text(UTILS)
    (folder / "nqswap.yaml").write_text(textwrap.dedent(f"""\
        task: juice_nqswap
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {folder / 'nqswap.jsonl'}
        test_split: test
        output_type: generate_until
        doc_to_text: "{{{{prompt}}}}"
        doc_to_target: "{{{{answers[0]}}}}"
        process_results: !function utils.process_results
        generation_kwargs:
          until: []
          max_gen_toks: 20
          do_sample: false
          temperature: 0
        metric_list:
          - metric: exact_match
            aggregation: mean
            higher_is_better: true
        """))
    artifact = HeadsArtifact(lm.fingerprint(), "contextual", 5, [], [], HEADS)
    # the plain name gets the server's default (Original: this heads file holds no tuned betas); each alias its own
    app = create_app(lm, [artifact], model_name="gemma",
                     aliases={"gemma+original": {"method": "original"}, "gemma+juice": JUICE})
    with _serving(app) as client:
        port = int(str(client.base_url).rstrip("/").split(":")[-1].split("/")[0])
        yield lm, port, folder, tokenizer


def _run(harness, model: str, task: str, limit: int) -> tuple[float, list[dict]]:
    """lm-eval's metric and its logged samples for `task` on `model` (a served name)."""
    from lm_eval.tasks import TaskManager

    lm, port, folder, tokenizer = harness
    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=(f"model={model},base_url=http://127.0.0.1:{port}/v1/completions,tokenizer={tokenizer},"
                    "tokenizer_backend=huggingface,add_bos_token=True,max_retries=1"),
        tasks=[task], task_manager=TaskManager(include_path=str(folder)), limit=limit, log_samples=True)
    metric = "acc,none" if task == "juice_memotrap" else "exact_match,none"
    return out["results"][task][metric], out["samples"][task]


@pytest.mark.parametrize("model", ["gemma+original", "gemma+juice"])
def test_memotrap_accuracy_in_the_harness_equals_juices_likelihood_metric(harness, model):
    lm = harness[0]
    accuracy, samples = _run(harness, model, "juice_memotrap", N_MEMOTRAP)
    examples = load_memotrap(MEMOTRAP, "proverb_ending")[:N_MEMOTRAP]
    steering = ORIGINAL if model == "gemma+original" else JuICE(lm, HEADS, JUICE["beta_plus"], JUICE["beta_minus"])
    wins = likelihood_wins(lm, examples, {"m": steering})["m"]
    assert len(samples) == N_MEMOTRAP
    assert accuracy == pytest.approx(sum(wins) / len(wins))
    per_item = {s["doc_id"]: bool(s["acc"]) for s in samples}
    assert [per_item[i] for i in range(N_MEMOTRAP)] == wins


@pytest.mark.parametrize("model", ["gemma+original", "gemma+juice"])
def test_nqswap_exact_match_in_the_harness_equals_juices(harness, model):
    lm = harness[0]
    exact, samples = _run(harness, model, "juice_nqswap", N_NQSWAP)
    examples = load_nqswap(NQSWAP)[:N_NQSWAP]
    steering = ORIGINAL if model == "gemma+original" else JuICE(lm, HEADS, JUICE["beta_plus"], JUICE["beta_minus"])
    results = evaluate_contextual(lm, examples, {"m": steering}, likelihood=False)
    outputs = {s["doc_id"]: s["filtered_resps"][0] for s in samples}
    assert [outputs[i] for i in range(N_NQSWAP)] == [r.output for r in results]
    assert exact == pytest.approx(sum(r.correct for r in results) / len(results))
