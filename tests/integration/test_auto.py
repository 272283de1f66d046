"""`auto` (juice.when_to_steer.auto; tuned by juice.when_to_steer.auto_tuning): a per-request choice among
steerings, made at the first step from the with-context and question-only distributions, decodes
exactly as the chosen static method; its policy is fitted on validation items only."""

from __future__ import annotations

import pytest
import torch

from juice.when_to_steer.auto import AutoPolicy, AutoRule
from juice.when_to_steer.signals import first_step_signal, passage_relevance
from juice.when_to_steer.auto_tuning import fit_policy, policy_picks
from juice.baselines.cad import CadPolicy, jsd_alpha
from juice.data.context_types import CONTEXT_TYPES
from juice.engine import INSTRUCTED, QUESTION_ALONE, Choice, Contrast, Stream, generate
from juice.steering import ORIGINAL, JuICE, JuNE

from helpers.auto import auto_selection, book_rows, nqswap_file, tiny_heads, tiny_model_and_heads
from helpers.context_rows import ROWS

pytestmark = pytest.mark.gpu   # benchmarks/gpu_check.py runs these on the device

TEXTS = ["the capital of france is paris . the capital of france is", "tennis golf w40 w41 w42 is",
         "the capital of france is", "w42 is", "w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 the",
         "ignore the passage . the capital of france is paris . the capital of france is",
         "ignore the passage . tennis golf w40 w41 w42 is"]
#         0: prompt                                                  1: prompt        2: question of 0   3: question of 1
#         5, 6: the instructed prompts of 0 and 1 (the Prompt baseline's form, INSTRUCTED)


def _candidates(lm):
    sel = auto_selection(lm)
    return (ORIGINAL, JuICE(lm, sel, 2.0, -1.0), JuNE(lm, sel, 1.0, -0.5), Contrast(-1, CadPolicy(jsd_alpha)),
            QUESTION_ALONE)


class Fixed:
    """A rule that always picks one candidate (the signal "forced")."""

    def __init__(self, index: int):
        self.index = index

    def __call__(self, with_context, question):
        return torch.full((with_context.shape[0],), self.index, dtype=torch.long)


@pytest.mark.parametrize("pick", [0, 1, 2, 3, 4, 5])
def test_a_forced_choice_equals_the_static_method(tiny, pick):
    """Forced to "no steering" it is Original; forced to a candidate it is that static steering
    (or AdaCAD's contrastive stream against the same question, or the question alone with the
    unmodified model: Original on the question's prompt, repetition penalty included, or the
    instructed prompt: Original on it, the Prompt baseline)."""
    cands = (*_candidates(tiny), INSTRUCTED)
    probes = torch.tensor([[5, 7], [9, 11]])
    penalty = 1.3 if pick >= 4 else 1.0
    auto = [Stream(0, choice=Choice(2, cands, Fixed(pick), instructed=5), repetition_penalty=penalty),
            Stream(1, choice=Choice(3, cands, Fixed(pick), instructed=6), repetition_penalty=penalty)]
    if pick == 3:
        static = [Stream(0, contrast=Contrast(2, cands[3].rule)), Stream(1, contrast=Contrast(3, cands[3].rule))]
    elif pick == 4:
        static = [Stream(2, repetition_penalty=penalty), Stream(3, repetition_penalty=penalty)]
    elif pick == 5:
        static = [Stream(5, repetition_penalty=penalty), Stream(6, repetition_penalty=penalty)]
    else:
        static = [Stream(0, cands[pick]), Stream(1, cands[pick])]
    got = generate(tiny, TEXTS, auto, 6, probe_tokens=probes)
    want = generate(tiny, TEXTS, static, 6, probe_tokens=probes)
    assert torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.first_probs, want.first_probs, rtol=0, atol=1e-6)


def test_auto_in_a_batch_equals_auto_alone_and_the_rule_sees_the_unmodified_rows(tiny):
    cands = _candidates(tiny)
    seen = []

    def by_signal(with_context, question):   # a real signal: the first-step JSD, cut at its median
        jsd = jsd_alpha(with_context, question)
        seen.append(jsd)
        return (jsd >= 0.05).long() * 3   # 0 (Original) or 3 (AdaCAD)

    rule = AutoRule((0.02, 0.05, 0.2, 0.4), (0, 1, 2, 3, 4))
    streams = [Stream(0, choice=Choice(2, cands, rule)), Stream(1, choice=Choice(3, cands, rule)),
               Stream(0, cands[1]), Stream(4), Stream(1, choice=Choice(3, cands, by_signal)),
               Stream(2, choice=Choice(2, cands, rule))]   # no passage: Original by its structure
    together = generate(tiny, TEXTS, streams, 6, max_rows=5)
    for k, s in enumerate(streams):
        alone = generate(tiny, TEXTS, [s], 6)
        assert torch.equal(together.tokens[k], alone.tokens[0]), k
    # each choosing stream with a passage decodes as the candidate its rule picks from the
    # unmodified logits (computed one at a time here: the pick is stable across layouts as long
    # as no signal lies within ~1e-6 of a threshold, which these texts' signals do not)
    for k, (p, q) in enumerate([(0, 2), (1, 3)]):
        pick = int(rule(*_first_logits(tiny, TEXTS[p], TEXTS[q])))
        alone = (Stream(p, contrast=Contrast(q, cands[3].rule)) if pick == 3 else Stream(q) if pick == 4
                 else Stream(p, cands[pick]))
        static = generate(tiny, TEXTS, [alone], 6)
        assert torch.equal(together.tokens[k], static.tokens[0])
    # and the one without a passage decodes as Original (the choice's without_passage, 0)
    assert torch.equal(together.tokens[5], generate(tiny, TEXTS, [Stream(2)], 6).tokens[0])
    assert seen
    # the signal of a passage-less request is 0 by its structure, exactly, in any batch layout
    signal = first_step_signal(tiny, [TEXTS[0], TEXTS[1], TEXTS[2]], [TEXTS[2], TEXTS[3], TEXTS[2]])
    assert float(signal[2]) == 0.0


class Perturbed:
    """A rule that sees its inputs as another processor's kernels might compute them: the
    question row off by 1e-6 (fp32 rows of one text at two places in a padded batch agree to
    about 1e-8 on one CPU, exactly on another), then cut at a threshold just above 0."""

    def __init__(self, picks):
        self.rule = AutoRule((1e-12,), picks)

    def __call__(self, with_context, question):
        return self.rule(with_context, question + 1e-6 * torch.arange(question.shape[-1], dtype=question.dtype))


@pytest.mark.parametrize("rule", [Fixed(1), Perturbed((0, 2))], ids=["always-juice", "signal-not-exactly-0"])
def test_a_request_without_a_passage_is_original_by_its_structure_not_its_signal(tiny, rule):
    """Issue 43: a request whose prompt is its question (no passage) decodes as Original whatever
    the rule would say, in a batch and alone, whether its question is the same prompt index or a
    copy of the text at another index; the engine reports the choice as `without_passage`."""
    from juice.engine.session import DecodingSession
    from juice.tokens import token_ids

    cands = _candidates(tiny)
    texts = TEXTS + [TEXTS[2]]   # a copy of 2, as the Steerer and the server lay a question out
    streams = [Stream(2, choice=Choice(len(TEXTS), cands, rule)), Stream(0, choice=Choice(2, cands, rule)),
               Stream(2, choice=Choice(2, cands, rule))]
    together = generate(tiny, texts, streams, 6)
    original = generate(tiny, texts, [Stream(2)], 6).tokens[0]
    assert torch.equal(together.tokens[0], original) and torch.equal(together.tokens[2], original)
    assert torch.equal(generate(tiny, texts, streams[:1], 6).tokens[0], original)
    # the stream with a passage still follows its rule (JuICE, JuNE or Original by the signal)
    pick = int(rule(*_first_logits(tiny, TEXTS[0], TEXTS[2])))
    assert torch.equal(together.tokens[1], generate(tiny, texts, [Stream(0, cands[pick])], 6).tokens[0])
    session = DecodingSession(tiny)
    ids = token_ids(tiny.tokenizer, TEXTS[2])
    session.add("q", ids, Stream(0, choice=Choice(1, cands, rule, without_passage=0)), 2, question_ids=ids)
    first = session.step()
    assert [t.choice for t in first] == [0]


def test_a_choice_refuses_a_without_passage_outside_its_candidates(tiny_llama):
    with pytest.raises(ValueError, match="without_passage"):
        Choice(2, _candidates(tiny_llama), Fixed(0), without_passage=5)


def test_a_policy_without_original_among_its_picks_still_holds_it_for_passage_less_requests(tiny_llama):
    policy = AutoPolicy((), ("june",), {"june": (1.0, 0.0)})
    choice = policy.choice(tiny_llama, auto_selection(tiny_llama))
    assert policy.candidates == ["original", "june"]
    assert choice.candidates[choice.without_passage] is ORIGINAL


def _first_logits(lm, prompt, question):
    from juice.tokens import encode

    out = []
    for text in (prompt, question):
        b = encode(lm.tokenizer, [text]).to(lm.device)
        with torch.no_grad():
            out.append(lm.model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[:, -1].float())
    return out


def test_first_step_signal_batched_equals_one_at_a_time(tiny_llama):
    prompts, questions = [TEXTS[0], TEXTS[1], TEXTS[4]], [TEXTS[2], TEXTS[3], TEXTS[4]]
    batched = first_step_signal(tiny_llama, prompts, questions)
    # fp32 (24-bit mantissa, ~6e-8 relative): a row's logits at another place in a padded batch
    # differ by about 1e-8 to 1e-6 (processor-dependent kernels); the JSD of two distributions
    # then moves by well under 1e-5 bits. Layouts differ, so no exact equality is asked here.
    for k in range(3):
        alone = first_step_signal(tiny_llama, prompts[k:k + 1], questions[k:k + 1])
        assert abs(float(batched[k]) - float(alone[0])) < 1e-5
        ref = jsd_alpha(*_first_logits(tiny_llama, prompts[k], questions[k]))
        assert abs(float(batched[k]) - float(ref[0])) < 1e-4
    assert float(batched[2]) == 0.0 and float(first_step_signal(tiny_llama, [TEXTS[2]], [TEXTS[2]])[0]) == 0.0


def test_fit_policy_picks_the_best_candidate_per_bin():
    # low signal: Original right, JuICE wrong; high signal: JuICE right, Original wrong
    signal = [0.0, 0.01, 0.02, 0.5, 0.6, 0.7, 0.0, 0.8]
    types = ["none", "irrelevant", "irrelevant", "conflicting", "conflicting", "gold", "none", "gold"]
    verdicts = {"original": [True, True, True, False, False, False, True, True],
                "juice": [False, False, False, True, True, True, False, True]}
    fit = fit_policy(verdicts, signal, types, ["s"] * 8, {"juice": (2.0, -1.0)})
    assert fit.policy.picks == ("original", "juice") and len(fit.policy.thresholds) == 1
    assert 0.02 < fit.policy.thresholds[0] < 0.5
    assert fit.mean == 100.0 and fit.per_type == {"gold": 100.0, "conflicting": 100.0, "irrelevant": 100.0,
                                                  "none": 100.0}
    assert fit.static == {"original": 62.5, "juice": 50.0}
    # one candidate best everywhere: no thresholds
    same = fit_policy({"original": [True] * 8, "juice": [False] * 8}, signal, types, ["s"] * 8, {"juice": (2.0, -1.0)})
    assert same.policy == AutoPolicy((), ("original",), {})


def test_fit_policy_scores_passage_less_items_as_original_and_sets_bins_on_the_others():
    # JuICE is right on every item but Original is right on the passage-less ("none") ones: the
    # fit may not buy those with a threshold at 0, and a none item's signal never moves a cut
    signal = [1e-8, 3e-8, 0.01, 0.5, 0.6, 0.7]
    types = ["none", "none", "irrelevant", "conflicting", "conflicting", "gold"]
    verdicts = {"original": [True, True, False, False, False, False], "juice": [False, False, True, True, True, True]}
    fit = fit_policy(verdicts, signal, types, ["s"] * 6, {"juice": (2.0, -1.0)})
    assert fit.policy == AutoPolicy((), ("juice",), {"juice": (2.0, -1.0)})
    assert fit.per_type == {"gold": 100.0, "conflicting": 100.0, "irrelevant": 100.0, "none": 100.0}
    # the flags, when given, are the structure's, not the type's
    flagged = fit_policy(verdicts, signal, types, ["s"] * 6, {"juice": (2.0, -1.0)}, [True] * 6)
    assert flagged.policy.picks == ("original", "juice") and 3e-8 < flagged.policy.thresholds[0] < 0.01
    with pytest.raises(ValueError, match="Original's verdicts"):
        fit_policy({"juice": [True] * 6}, signal, types, ["s"] * 6, {"juice": (2.0, -1.0)})


def test_a_policy_round_trips_and_refuses_malformed_input():
    policy = AutoPolicy((0.1, 0.3), ("original", "juice/2", "juice"), {"juice": (2.0, -1.0), "juice/2": (1.0, -0.5)})
    assert AutoPolicy.from_json(policy.to_json()) == policy
    with pytest.raises(ValueError, match="ascending"):
        AutoPolicy((0.3, 0.1), ("original", "juice", "juice"), {"juice": (1.0, 0.0)})
    with pytest.raises(ValueError, match="needs its betas"):
        AutoPolicy((0.1,), ("original", "juice"))
    with pytest.raises(ValueError, match="unknown candidate"):
        AutoPolicy((), ("cad",))
    with pytest.raises(ValueError, match="unknown signal"):
        AutoPolicy.from_json({"signal": "entropy", "thresholds": [], "picks": ["original"]})
    with pytest.raises(ValueError, match="malformed"):
        AutoPolicy.from_json({"thresholds": [], "betas": {}})


def test_a_choice_refuses_its_own_steering_and_an_empty_candidate_list(tiny_llama):
    cands = _candidates(tiny_llama)
    with pytest.raises(ValueError, match="no steering"):
        Stream(0, cands[1], choice=Choice(2, cands, Fixed(0)))
    with pytest.raises(ValueError, match="at least one"):
        Choice(2, (), Fixed(0))


# -- tuning, the evaluation, the Steerer and the command line --------------------------------

def test_tuning_reads_validation_items_only_and_auto_evaluates_as_its_choices(tiny_llama, tmp_path, monkeypatch):
    """Issue 44: the policy depends on validation questions only: one file split by question;
    changing a test question's row leaves the fit's inputs and the policy as they were, changing
    a validation question's row changes what the fit sees."""
    import juice.when_to_steer.auto_tuning as auto
    from juice.when_to_steer.auto import policy_of
    from juice.when_to_steer.auto_tuning import tune_auto
    from juice.data.context_types import split_of
    from juice.data.nqswap import question_prompt
    from juice.when_to_steer import context_items, evaluate_contexts

    lm = tiny_llama
    rows = book_rows(12)
    half = {s: [k for k, r in enumerate(rows) if split_of(question_prompt(r["question"])) == s]
            for s in ("validation", "test")}
    assert len(half["validation"]) >= 3 and len(half["test"]) >= 3

    def changed(k: int) -> list[dict]:
        out = [dict(r) for r in rows]
        out[k] = dict(out[k], sub_answer=["Borges"], sub_context=f"<P> Book {k} is by Borges , said all . </P>",
                      org_context=f"<P> Book {k} , it is agreed , was written by {rows[k]['org_answer'][0]} . </P>")
        return out

    seen = []
    fit_policy = auto.fit_policy
    monkeypatch.setattr(auto, "fit_policy", lambda *a, **k: seen.append((a, k)) or fit_policy(*a, **k))
    files = {"same": rows, "test changed": changed(half["test"][0]), "validation changed": changed(half["validation"][0])}
    policies = {}
    for name, data in files.items():
        val, where = context_items(nqswap_file(tmp_path / f"{name}.jsonl", data), split="validation")
        assert all(split_of(i.question) == "validation" for i in val.items)
        artifact = tiny_heads(lm)
        fit = tune_auto(lm, artifact, val, where=where)
        policies[name] = {k: v for k, v in artifact.tuned["auto"].items() if k != "data"}   # "data": the path
    same, test_changed, val_changed = seen
    assert repr(same) == repr(test_changed) and policies["same"] == policies["test changed"]
    assert repr(same) != repr(val_changed)   # the fit sees a validation row (its signal moves)
    items, where = context_items(nqswap_file(tmp_path / "test.jsonl", rows), split="test")
    assert not {i.question for i in items.items} & {i.question for i in val.items}
    artifact = tiny_heads(lm)
    fit = tune_auto(lm, artifact, context_items(tmp_path / "same.jsonl", split="validation")[0])
    report = evaluate_contexts(lm, [artifact], items, ["original", "juice", "auto"], data=where, resamples=1000)
    assert report.methods == ["original", "juice-ctx", "auto-ctx"]
    assert fit.policy == policy_of({"auto": policies["same"]})
    # auto's output on every test item is its chosen candidate's output, alone
    policy = fit.policy
    signal = first_step_signal(lm, [i.prompt for i in items.items], [i.question for i in items.items])
    outputs = {(r.item, r.conflict_type, r.method): r.output for r in report.results}
    from juice.when_to_steer.evaluation import result_id
    from juice.steerer import Steerer

    for item, x in zip(items.items, signal.tolist()):
        pick = policy.picks[sum(x >= t for t in policy.thresholds)] if item.prompt != item.question else "original"
        steerer = Steerer(lm, artifact, method="original") if pick == "original" else Steerer(
            lm, artifact, method="juice", beta_plus=policy.betas[pick][0], beta_minus=policy.betas[pick][1])
        got = outputs[result_id(item), item.context_type, "auto-ctx"]
        assert got == steerer.generate(item.prompt, 20)[0]
        assert got == Steerer(lm, artifact, method="auto").generate(item.prompt, 20, questions=item.question)[0]


def test_the_steerer_runs_auto_with_questions_and_refuses_without(tiny_llama):
    from juice.steerer import Steerer

    lm = tiny_llama
    with pytest.raises(ValueError, match="juice tune --methods auto"):
        Steerer(lm, tiny_heads(lm), method="auto")
    policy = AutoPolicy((0.0,), ("original", "juice"), {"juice": (2.0, -1.0)})   # JSD >= 0: always JuICE
    artifact = tiny_heads(lm, {"juice": {"beta_plus": 2.0, "beta_minus": -1.0}, "auto": policy.to_json()})
    auto = Steerer(lm, artifact, method="auto")
    static = Steerer(lm, artifact, method="juice", beta_plus=2.0, beta_minus=-1.0)
    prompts, questions = [TEXTS[0], TEXTS[1]], [TEXTS[2], TEXTS[3]]
    assert auto.generate(prompts, 8, questions=questions) == static.generate(prompts, 8)
    assert "".join(auto.stream(prompts[0], 8, question=questions[0])) == static.generate(prompts[0], 8)[0]
    with pytest.raises(ValueError, match="each prompt's question"):
        auto.generate(prompts, 8)
    with pytest.raises(ValueError, match="questions are for method auto"):
        static.generate(prompts, 8, questions=questions)
    with pytest.raises(ValueError, match="give no betas"):
        Steerer(lm, artifact, method="auto", beta_plus=1.0)


def test_the_steerer_runs_auto_s_prompt_candidate_as_the_instructed_prompt(tiny_llama, monkeypatch):
    """A policy that picks "prompt-mem" decodes each prompt in the Prompt baseline's form toward
    memory (instructed_request) with the unmodified model: generate, stream and chat (whose
    instruction goes into the last user message) equal Original on that prompt."""
    from juice.baselines.prompt import instructed_request
    from juice.completion_text import instructed_messages
    from juice.steerer import Steerer

    lm = tiny_llama   # shared by the session: its template is set for this test only
    monkeypatch.setattr(lm.tokenizer, "chat_template",
                        "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}is", raising=False)
    policy = AutoPolicy((), ("prompt-mem",))
    artifact = tiny_heads(lm, {"auto": policy.to_json()})
    auto, original = Steerer(lm, artifact, method="auto"), Steerer(lm, artifact, method="original")
    prompts, questions = [TEXTS[0], TEXTS[1]], [TEXTS[2], TEXTS[3]]
    instructed = [instructed_request(p, q, lm.config.model_type) for p, q in zip(prompts, questions)]
    assert instructed[0] != prompts[0] and instructed[0].endswith(prompts[0])
    want = original.generate(instructed, 8)
    assert auto.generate(prompts, 8, questions=questions) == want
    assert "".join(auto.stream(prompts[0], 8, question=questions[0])) == want[0]
    messages = [{"role": "user", "content": prompts[0]}]
    assert auto.chat(messages, 8, question=questions[0]) == original.chat(
        instructed_messages(messages, questions[0], lm.config.model_type), 8)
    # without a passage (the prompt is its question) it is Original on the prompt, as every policy
    assert auto.generate(questions, 8, questions=questions) == original.generate(questions, 8)
    with pytest.raises(ValueError, match="2 prompts, 1 instructions"):
        auto.generate(prompts, 8, questions=questions, instructions=instructed[:1])
    with pytest.raises(ValueError, match="instructions are for method auto"):
        original.generate(prompts, 8, instructions=instructed)


def test_juice_tune_methods_auto_from_the_command_line(tmp_path, capsys):
    import json

    import juice.apps.cli as cli

    folder, heads = tiny_model_and_heads(tmp_path)
    data = nqswap_file(tmp_path / "val.jsonl", ROWS)
    assert cli.main(["tune", "--heads", str(heads), "--data", str(data), "--methods", "auto", "--limit", "3",
                     "--model", str(folder), "--device", "cpu"]) == 0
    assert "auto:" in capsys.readouterr().out
    saved = json.loads(heads.read_text())["tuned"]["auto"]
    assert saved["signal"] == "jsd_bits" and saved["data"]["counts"] == {t: 3 for t in CONTEXT_TYPES}
    assert set(saved["validation"]["static"]) == {"original", "question", "prompt-mem", "juice", "juice/2", "adacad"}
    out = tmp_path / "out"
    assert cli.main(["evaluate", "--contexts", "gold,conflicting,irrelevant,none", "--data", str(data), "--heads",
                     str(heads), "--limit", "2", "--model", str(folder), "--device", "cpu", "--out", str(out)]) == 0
    assert "auto-ctx" in json.loads((out / "contexts.json").read_text())["methods"]


def test_auto_choosing_adacad_evaluates_as_adacad(tiny_llama, tmp_path):
    """A policy whose every bin is AdaCAD gives AdaCAD's outputs in the context-type evaluation
    (the choice's contrast candidate, keyed apart from the steerings)."""
    from juice.when_to_steer import context_items, evaluate_contexts

    policy = AutoPolicy((0.0,), ("june", "adacad"), {"june": (1.0, 0.0)})   # JSD >= 0: always AdaCAD
    artifact = tiny_heads(tiny_llama, {"juice": {"beta_plus": 2.0, "beta_minus": -1.0}, "auto": policy.to_json()})
    items, where = context_items(nqswap_file(tmp_path / "t.jsonl", ROWS[:3]))
    report = evaluate_contexts(tiny_llama, [artifact], items, ["adacad", "auto"], data=where, resamples=1000)
    outputs = {}
    for r in report.results:
        outputs.setdefault((r.item, r.conflict_type), {})[r.method] = r.output
    assert all(o["auto-ctx"] == o["adacad"] for o in outputs.values())


def test_fit_policy_never_picks_a_candidate_that_degenerates_beyond_the_margin():
    """Issue 49: JuICE is right everywhere on validation but a third of its outputs repeat
    themselves (Original: none); with the margin of `juice tune` (10 points) the fit may not pick it."""
    signal = [0.0, 0.01, 0.5, 0.6, 0.7, 0.8]
    types = ["none", "irrelevant", "conflicting", "conflicting", "gold", "gold"]
    verdicts = {"original": [True, True, False, False, True, False], "juice": [True] * 6}
    degenerate = {"original": [False] * 6, "juice": [False, False, True, True, False, False]}
    free = fit_policy(verdicts, signal, types, ["s"] * 6, {"juice": (2.0, -1.0)})
    assert "juice" in free.policy.picks
    fit = fit_policy(verdicts, signal, types, ["s"] * 6, {"juice": (2.0, -1.0)}, degenerate=degenerate)
    assert fit.policy == AutoPolicy((), ("original",), {}) and fit.refused == ("juice",)
    assert fit.degeneration == {"original": 0.0, "juice": pytest.approx(100 / 3)} and "juice" in fit.static
    assert fit_policy(verdicts, signal, types, ["s"] * 6, {"juice": (2.0, -1.0)}, degenerate=degenerate,
                      margin=40).policy.picks == free.policy.picks


def test_fit_policy_gates_irrelevant_passages_to_the_question_alone():
    """Issue 44: an irrelevant passage (few of the question's words) is answered best without it;
    the JSD cannot tell it from a conflicting one here (same signals), the relevance gate can."""
    signal = [0.6, 0.6, 0.6, 0.6, 0.0, 0.6]
    types = ["irrelevant", "irrelevant", "conflicting", "conflicting", "none", "gold"]
    relevance = [0.0, 0.1, 0.8, 0.9, 1.0, 0.7]
    verdicts = {"original": [False, False, True, True, True, True], "question": [True, True, False, False, True, False]}
    fit = fit_policy(verdicts, signal, types, ["s"] * 6, {}, relevance=relevance)
    assert fit.policy.relevance is not None and 0.1 < fit.policy.relevance < 0.7
    assert fit.policy.irrelevant == "question" and fit.policy.picks == ("original",) and fit.mean == 100.0
    assert fit_policy(verdicts, signal, types, ["s"] * 6, {}).mean < 100.0   # without the gate
    assert policy_picks(fit.policy, signal, [t != "none" for t in types], relevance) == [
        "question", "question", "original", "original", "original", "original"]
    assert AutoPolicy.from_json(fit.policy.to_json()) == fit.policy
    with pytest.raises(ValueError, match="unknown gate"):
        AutoPolicy.from_json({**fit.policy.to_json(), "gate": {"signal": "bm25", "threshold": 0.1, "pick": "question"}})


def test_passage_relevance_counts_the_questions_words_in_the_passage_wherever_they_stand():
    question = "The capital of France is"
    assert passage_relevance(f"Paris is the capital of France. {question}", question) == 1.0
    assert passage_relevance(f"Berlin is the capital of Germany. {question}", question) == 0.5   # not "france"
    assert passage_relevance(question, question) == 0.0                                           # no passage
    assert passage_relevance("Paris is nice. Is it?", "Is it?") == 1.0                            # nothing to judge by
    # the question's first word is found only where the passage holds it: a word at the start of
    # a text counts as one after a space (tokens: "Michael" and " Michael" differ)
    asked = "Michael Jordan plays the sport of"
    assert passage_relevance(f"Tiger Woods plays golf. {asked}", asked) == 0.25   # "plays" of michael, jordan,
    assert passage_relevance(f"Michael Jordan retired twice. {asked}", asked) == 0.5   # plays, sport
    # the prompt format's words (Context:, Question:, Answer:) are not the question's
    nq = "Question: who wrote the iliad?\nAnswer:"
    assert passage_relevance(f"Context: Homer is said to have written it.\n{nq}", nq) == 0.0
    assert passage_relevance(f"Context: The Iliad, by Homer, tells of Troy.\n{nq}", nq) == 0.5   # iliad, not wrote


def test_a_relevance_gate_decodes_the_question_alone_in_the_engine(tiny):
    """The gate decides from the request's tokens before any forward: below it the stream is
    Original on the question (tokens and first-step probabilities), above it the rule chooses;
    in a batch as alone."""
    from juice.when_to_steer.signals import RelevanceGate

    cands = _candidates(tiny)
    never, always = RelevanceGate(-1.0, 4, tiny.tokenizer), RelevanceGate(2.0, 4, tiny.tokenizer)
    probes = torch.tensor([[5, 7], [9, 11], [5, 7]])
    streams = [Stream(0, choice=Choice(2, cands, Fixed(1), gate=always)),
               Stream(1, choice=Choice(3, cands, Fixed(1), gate=never)),
               Stream(0, choice=Choice(2, cands, Fixed(1), gate=always))]
    got = generate(tiny, TEXTS, streams, 6, probe_tokens=probes)
    want = generate(tiny, TEXTS, [Stream(2), Stream(1, cands[1]), Stream(2)], 6, probe_tokens=probes)
    assert torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.first_probs, want.first_probs, rtol=0, atol=1e-6)
    alone = generate(tiny, TEXTS, streams[:1], 6)
    assert torch.equal(alone.tokens[0], want.tokens[0])


def test_a_gate_that_picks_the_instructed_prompt_decodes_it_alone_and_in_a_batch(tiny):
    """A gate's pick made before any forward may be the instructed prompt (INSTRUCTED): the
    stream is then Original on that prompt, repetition penalty included; a stream whose choice
    may decode it but is not given it is refused in one line."""
    from juice.engine.session import DecodingSession
    from juice.tokens import token_ids
    from juice.when_to_steer.signals import RelevanceGate

    cands = (*_candidates(tiny), INSTRUCTED)
    always = RelevanceGate(2.0, 5, tiny.tokenizer)
    streams = [Stream(0, choice=Choice(2, cands, Fixed(1), gate=always, instructed=5), repetition_penalty=1.3),
               Stream(1, choice=Choice(3, cands, Fixed(5), instructed=6), repetition_penalty=1.3)]
    got = generate(tiny, TEXTS, streams, 6)
    want = generate(tiny, TEXTS, [Stream(5, repetition_penalty=1.3), Stream(6, repetition_penalty=1.3)], 6)
    assert torch.equal(got.tokens, want.tokens)
    assert torch.equal(generate(tiny, TEXTS, streams[:1], 6).tokens[0], want.tokens[0])
    session = DecodingSession(tiny)
    ids = token_ids(tiny.tokenizer, TEXTS[0])
    with pytest.raises(ValueError, match="instructed prompt"):
        session.add("a", ids, Stream(0, choice=Choice(1, cands, Fixed(5))), 2,
                    question_ids=token_ids(tiny.tokenizer, TEXTS[2]))


@pytest.mark.parametrize("name", ["confidence_gain", "context_peakedness"])
def test_a_model_gate_decodes_below_its_threshold_as_its_pick_in_the_engine(tiny, name):
    """A model-based gate is read at the first step from the two unmodified rows: a request whose
    signal (the batched features') is below the threshold decodes its pick (here the question
    alone), the others the rule's bin; in a batch as alone."""
    from juice.when_to_steer.signals import first_step_features

    cands = _candidates(tiny)
    values = first_step_features(tiny, [TEXTS[0], TEXTS[1]], [TEXTS[2], TEXTS[3]])[name]
    assert values[0] != values[1]
    threshold = float(values.mean())
    rule = AutoRule((), (1,), name, threshold, 4)
    streams = [Stream(0, choice=Choice(2, cands, rule)), Stream(1, choice=Choice(3, cands, rule))]
    got = generate(tiny, TEXTS, streams, 6)
    alone = [Stream(k + 2) if v < threshold else Stream(k, cands[1]) for k, v in enumerate(values)]
    want = generate(tiny, TEXTS, alone, 6)
    assert torch.equal(got.tokens, want.tokens)
    for k in range(2):
        assert torch.equal(generate(tiny, TEXTS, streams[k:k + 1], 6).tokens[0], want.tokens[k])


def test_fit_policy_chooses_the_gate_signal_that_separates_on_validation():
    """Where the lexical share cannot tell the irrelevant passages (it is equal everywhere) and
    the confidence gain can, the fit gates on the gain; where both can, on the lexical share
    (the first in GATE_SIGNALS); the policy round-trips with its signal and says it in one line."""
    from juice.when_to_steer.signals import CONFIDENCE_GAIN, RELEVANCE

    signal = [0.6, 0.6, 0.6, 0.6, 0.0, 0.6]
    types = ["irrelevant", "irrelevant", "conflicting", "conflicting", "none", "gold"]
    verdicts = {"original": [False, False, True, True, True, True], "question": [True, True, False, False, True, False]}
    gain = [-0.5, 0.1, 1.2, 0.9, 0.0, 1.0]
    flat = {RELEVANCE: [0.5] * 6, CONFIDENCE_GAIN: gain}
    fit = fit_policy(verdicts, signal, types, ["s"] * 6, {}, relevance=flat)
    assert fit.policy.gate == CONFIDENCE_GAIN and 0.1 < fit.policy.relevance < 0.9 and fit.mean == 100.0
    assert policy_picks(fit.policy, signal, [t != "none" for t in types], flat)[:2] == ["question", "question"]
    assert policy_picks(fit.policy, signal, [t != "none" for t in types], {RELEVANCE: [0.0] * 6}) == [
        "original", "original", "original", "original", "original", "original"]   # the gain's values, not another's
    both = {RELEVANCE: [0.0, 0.1, 0.8, 0.9, 1.0, 0.7], CONFIDENCE_GAIN: gain}
    assert fit_policy(verdicts, signal, types, ["s"] * 6, {}, relevance=both).policy.gate == RELEVANCE
    assert AutoPolicy.from_json(fit.policy.to_json()) == fit.policy
    assert "nats of confidence gain -> below: question" in fit.policy.describe()
    with pytest.raises(ValueError, match="unknown gate signal"):
        AutoPolicy(relevance=0.1, gate="bm25")


def test_cross_validation_holds_each_question_out_once_and_chooses_static_on_training_folds():
    from juice.when_to_steer.auto_tuning import cross_validate

    n = 24
    types = ["gold", "conflicting", "irrelevant", "none"] * (n // 4)
    groups = [k // 4 for k in range(n)]
    signal = [0.1 * (k % 4) for k in range(n)]
    relevance = [0.0 if t == "irrelevant" else 1.0 for t in types]
    verdicts = {"original": [t != "irrelevant" for t in types], "question": [t in ("irrelevant", "none") for t in types]}
    static = {"Original": verdicts["original"], "Question-only": verdicts["question"], "Never": [False] * n}
    held = cross_validate(verdicts, static, signal, types, ["s"] * n, groups, {}, relevance=relevance, folds=3)
    assert held["folds"] == 3 and held["chosen"] == ["Original"] * 3
    assert held["auto"] == [True] * n and held["best_static"] == static["Original"]
    with pytest.raises(ValueError, match="two groups"):
        cross_validate(verdicts, static, signal, types, ["s"] * n, [0] * n, {})


@pytest.mark.parametrize("folds", [3, 0], ids=["3-fold", "one-source-out"])
def test_cross_validation_never_fits_on_the_fold_it_holds_out(monkeypatch, folds):
    """Each fold's policy is fitted on items none of which it is then applied to (every item's
    signal is its own, so the fit's items and the held-out ones can be told apart)."""
    import juice.when_to_steer.auto_tuning as auto_module
    from juice.when_to_steer.auto_tuning import cross_validate

    n = 24
    types = ["gold", "conflicting", "irrelevant", "none"] * (n // 4)
    sources = [f"s{k % 3}" for k in range(n // 4) for _ in range(4)]
    groups = sources if folds == 0 else [k // 4 for k in range(n)]
    signal = [0.01 * (k + 1) for k in range(n)]
    verdicts = {"original": [k % 3 == 0 for k in range(n)], "question": [k % 2 == 0 for k in range(n)]}
    fitted, applied, fitting = [], [], []
    real_fit, real_picks = auto_module.fit_policy, auto_module.policy_picks

    def fit(verdicts, signal, *args, **kwargs):
        fitted.append(set(signal))
        fitting.append(True)
        try:
            return real_fit(verdicts, signal, *args, **kwargs)
        finally:
            fitting.pop()

    def picks(policy, signal, *args, **kwargs):
        if not fitting:   # the fit's own picks on its training items are not an application
            applied.append(set(signal))
        return real_picks(policy, signal, *args, **kwargs)

    monkeypatch.setattr(auto_module, "fit_policy", fit)
    monkeypatch.setattr(auto_module, "policy_picks", picks)
    held = cross_validate(verdicts, {"Original": verdicts["original"]}, signal, types, sources, groups, {},
                          folds=folds)
    assert len(fitted) == len(applied) == held["folds"] == 3
    for train, out in zip(fitted, applied):
        assert not train & out and train | out == set(signal)
    assert set().union(*applied) == set(signal) and sum(map(len, applied)) == n


@pytest.mark.parametrize("policy", [AutoPolicy((), ("question",)),
                                    AutoPolicy((), ("june",), {"june": (1.0, 0.0)}, relevance=2.0)],
                         ids=["bins-pick-question", "gate-picks-question"])
def test_auto_choosing_the_question_alone_evaluates_as_question_only(tiny_llama, tmp_path, policy):
    """A policy whose bins, or whose gate (every passage below a threshold of 2), pick the
    question alone gives, in the context-type evaluation, the unmodified model's output on each
    item's question (Question-only, read from Original's none items)."""
    from juice.when_to_steer.evaluation import QUESTION_ONLY, question_only_results
    from juice.when_to_steer import context_items, evaluate_contexts

    artifact = tiny_heads(tiny_llama, {"juice": {"beta_plus": 2.0, "beta_minus": -1.0}, "auto": policy.to_json()})
    items, where = context_items(nqswap_file(tmp_path / "t.jsonl", ROWS[:3]))
    report = evaluate_contexts(tiny_llama, [artifact], items, ["original", "auto"], data=where, resamples=1000)
    alone = {(r.item, r.conflict_type): r.output for r in question_only_results(items.items, report.results)}
    auto = {(r.item, r.conflict_type): r.output for r in report.results if r.method == "auto-ctx"}
    assert auto == alone and len(auto) == len(items.items)
    assert QUESTION_ONLY == "Question-only"


def test_cross_validation_chooses_the_best_static_method_on_each_training_fold_not_on_all_items():
    """Issue 77: where the best static method on all items (A) is not the best on a fold's training
    items (B, ties going to the first listed), the held-out items get B's verdicts: the choice
    never sees the items it is scored on."""
    from juice.when_to_steer.auto_tuning import cross_validate

    groups = [g for g in range(5) for _ in range(4)]
    types = ["gold", "conflicting", "irrelevant", "none"] * 5
    a = [g in (0, 1, 2) for g in groups]   # right on three groups: the best on all items
    b = [g in (3, 4) for g in groups]      # right on two
    static = {"B": b, "A": a}
    assert max(static, key=lambda m: sum(static[m])) == "A"
    verdicts = {"original": a, "question": b}
    held = cross_validate(verdicts, static, [0.0] * 20, types, ["s"] * 20, groups, {}, folds=0)
    assert sorted(set(held["chosen"])) == ["A", "B"]
    for i, g in enumerate(groups):   # held out, groups 0-2 leave A and B tied on training: B is chosen
        assert held["best_static"][i] == (b[i] if g in (0, 1, 2) else a[i])
    assert sum(held["best_static"]) < sum(a)   # the all-items choice would have scored A's 12 of 20
