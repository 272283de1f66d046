"""lm-evaluation-harness (`local-completions`) against `juice serve`, on the embedded Gemma 3 270M:
a multiple-choice MemoTrap task whose accuracy equals juice's own likelihood metric on the same
items, and the tasks `juice tasks` writes (NQ-Swap, MemoTrap as the paper scores it, the
context types) whose figures equal juice's own evaluation item by item, with the same outputs,
for Original and for JuICE chosen by a served-model alias (the generative tasks for Original are
`long`: the README's tests run them for JuICE, the same plumbing with steering). The tasks are
local YAMLs over ../shared/data (the harness cannot download here)."""

from __future__ import annotations

import os
import textwrap

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
lm_eval = pytest.importorskip("lm_eval")
from conftest import SHARED  # noqa: E402
from helpers.server import serving_client  # noqa: E402

from juice.apps.server import create_app  # noqa: E402
from juice.eval.harness_tasks import write_tasks  # noqa: E402
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
GENERATIVE_MODELS = [pytest.param("gemma+original", marks=pytest.mark.long), "gemma+juice"]
"""The served names the generative tasks run for; Original's are `long` (the same plumbing as JuICE's)."""

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
        task: juice_memotrap_likelihood
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
    write_tasks(folder, SHARED / "data")   # juice_nqswap, juice_memotrap_*, juice_contexts_*
    artifact = HeadsArtifact(lm.fingerprint(), "contextual", 5, [], [], HEADS)
    # the plain name gets the server's default (Original: this heads file holds no tuned betas); each alias its own
    app = create_app(lm, [artifact], model_name="gemma",
                     aliases={"gemma+original": {"method": "original"}, "gemma+juice": JUICE})
    with serving_client(app) as client:
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
    metric = "acc,none" if task == "juice_memotrap_likelihood" else "use_relevant,none" if "contexts" in task else "exact_match,none"
    return out["results"][task][metric], out["samples"][task]


@pytest.mark.parametrize("model", ["gemma+original", "gemma+juice"])
def test_memotrap_accuracy_in_the_harness_equals_juices_likelihood_metric(harness, model):
    lm = harness[0]
    accuracy, samples = _run(harness, model, "juice_memotrap_likelihood", N_MEMOTRAP)
    examples = load_memotrap(MEMOTRAP, "proverb_ending")[:N_MEMOTRAP]
    steering = ORIGINAL if model == "gemma+original" else JuICE(lm, HEADS, JUICE["beta_plus"], JUICE["beta_minus"])
    wins = likelihood_wins(lm, examples, {"m": steering})["m"]
    assert len(samples) == N_MEMOTRAP
    assert accuracy == pytest.approx(sum(wins) / len(wins))
    per_item = {s["doc_id"]: bool(s["acc"]) for s in samples}
    assert [per_item[i] for i in range(N_MEMOTRAP)] == wins


def _steering(lm, model):
    return ORIGINAL if model == "gemma+original" else JuICE(lm, HEADS, JUICE["beta_plus"], JUICE["beta_minus"])


@pytest.mark.parametrize("model", GENERATIVE_MODELS)
def test_juice_tasks_nqswap_and_memotrap_in_the_harness_equal_juices_evaluation(harness, model):
    """`juice tasks`' NQ-Swap and MemoTrap (as the paper scores it): the harness's outputs and
    exact match equal juice's evaluation (evaluate_contextual) item by item."""
    lm = harness[0]
    for task, examples in [("juice_nqswap", load_nqswap(NQSWAP)[:N_NQSWAP]),
                           ("juice_memotrap_proverb_ending", load_memotrap(MEMOTRAP, "proverb_ending")[:N_NQSWAP])]:
        exact, samples = _run(harness, model, task, N_NQSWAP)
        results = evaluate_contextual(lm, examples, {"m": _steering(lm, model)}, likelihood=False)
        outputs = {s["doc_id"]: s["filtered_resps"][0] for s in samples}
        assert [outputs[i] for i in range(N_NQSWAP)] == [r.output for r in results], task
        per_item = {s["doc_id"]: bool(s["exact_match"]) for s in samples}
        assert [per_item[i] for i in range(N_NQSWAP)] == [r.correct for r in results], task
        assert exact == pytest.approx(sum(r.correct for r in results) / len(results))


@pytest.mark.parametrize("model", GENERATIVE_MODELS)
def test_juice_tasks_context_types_in_the_harness_equal_juices_evaluation(harness, model):
    """The context-type tasks: per item, the harness's use-relevant, trust-memory and follow
    verdicts equal juice's (evaluate_context_types), NQ-Swap and ParaConflict."""
    from juice.data.context_types import nqswap_context_items, paraconflict_context_items
    from juice.data.nqswap import read_records
    from juice.data.paraconflict import DOMAINS, build_domain
    from juice.when_to_steer.evaluation import evaluate_context_types

    lm = harness[0]
    sources = {"nqswap": nqswap_context_items(read_records(NQSWAP), 0).items,
               "paraconflict": paraconflict_context_items([e for d in DOMAINS for e in build_domain(d)], 0).items}
    for source, kind in [("nqswap", "irrelevant"), ("nqswap", "gold"), ("paraconflict", "conflicting")]:
        task = f"juice_contexts_{source}_{kind}"
        items = [i for i in sources[source] if i.context_type == kind][:N_NQSWAP]
        figure, samples = _run(harness, model, task, N_NQSWAP)
        results = evaluate_context_types(lm, items, {"m": _steering(lm, model)})
        by_doc = {s["doc_id"]: s for s in samples}
        for k, r in enumerate(results):
            assert bool(by_doc[k]["use_relevant"]) == r.correct, (task, k)
            assert bool(by_doc[k]["trust_memory"]) == r.follows_parametric, (task, k)
            assert bool(by_doc[k]["follows_context"]) == r.follows_context, (task, k)
        assert figure == pytest.approx(sum(r.correct for r in results) / len(results))
