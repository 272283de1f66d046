"""Continuous batching (juice.engine.session): streams that join a running batch mid-flight and leave
it when they end get exactly the tokens they get alone from `generate`; cancelled streams free
their rows; stop predicates end a stream."""

from __future__ import annotations

import pytest
import torch

from juice.engine import DecodingSession
from juice.engine import Stream, generate
from juice.interventions import Head, HeadSelection
from juice.engine.sampling import Sampling
from juice.steering import ORIGINAL, JuICE, JuNE
from juice.tokens import token_ids

pytestmark = pytest.mark.gpu   # benchmarks/gpu_check.py runs these on the device

SEL = HeadSelection((Head(1, 2),), (Head(0, 1),))
PROMPTS = ["the capital of france is", "the name of the capital city of japan is",
           "w1 w2 w3 the name of the capital city of spain is w4 w5 w6 w7", "x",
           "the capital of germany is"]


def _requests(lm):
    """(prompt, stream, max_new_tokens, the step it joins): every steering, greedy and seeded
    sampling, with and without a repetition penalty, prompts of 2 to 17 tokens, 3 to 19 new
    tokens, joining at steps 0 to 10 (so they join and leave while others run)."""
    steerings = [ORIGINAL, JuICE(lm, SEL, 3, -1), JuNE(lm, SEL, 1, -0.5)]
    out = []
    for i in range(11):
        sampling = Sampling(0.9, 5 * (i % 3), 0.95 if i % 4 == 3 else 1.0, 7 + i) if i % 2 else None
        stream = Stream(0, steerings[i % 3], sampling, 1.3 if i % 4 == 1 else 1.0)
        out.append((PROMPTS[i % len(PROMPTS)], stream, 3 + 8 * (i % 3), i))
    return out


def _alone(lm, requests) -> list[list[int]]:
    """Each request decoded by itself with `generate`, cut after its EOS."""
    eos = lm.tokenizer.eos_token_id
    rows = []
    for prompt, stream, n, _ in requests:
        row = generate(lm, [prompt], [stream], n, stop_at_eos=True).tokens[0].tolist()
        rows.append(row[: row.index(eos) + 1] if eos in row else row)
    return rows


def _run(session, lm, requests, cancel_at: dict | None = None) -> dict:
    got = {i: [] for i in range(len(requests))}
    finished = {}
    step = 0
    while step <= max(r[3] for r in requests) or not session.idle:
        for i, (prompt, stream, n, join) in enumerate(requests):
            if join == step:
                session.add(i, token_ids(lm.tokenizer, prompt), stream, n)
        for i, at in (cancel_at or {}).items():
            if at == step:
                session.cancel(i)
        for t in session.step():
            got[t.key].append(t.token)
            if t.finished:
                finished[t.key] = t.finished
        step += 1
        assert step < 200
    return got, finished


def test_streams_joining_mid_flight_get_their_tokens_alone(tiny):
    requests = _requests(tiny)
    alone = _alone(tiny, requests)
    session = DecodingSession(tiny)
    got, finished = _run(session, tiny, requests)
    assert got == dict(enumerate(alone))
    eos = tiny.tokenizer.eos_token_id
    assert finished == {i: "eos" if row[-1] == eos else "length" for i, row in enumerate(alone)}
    assert session.rows == 0 and session.idle


def test_a_full_batch_makes_streams_wait_in_order_and_tokens_do_not_change(tiny_gemma3):
    lm = tiny_gemma3   # sliding-window layers (window 6): the merge pads and trims them too
    requests = _requests(lm)
    session = DecodingSession(lm)
    got = {i: [] for i in range(len(requests))}
    for i, (prompt, stream, n, _) in enumerate(requests):
        session.add(i, token_ids(lm.tokenizer, prompt), stream, n)
    seen_rows = []
    while not session.idle:
        for t in session.step(max_rows=4):
            got[t.key].append(t.token)
        seen_rows.append(session.rows)
    assert max(seen_rows) <= 4
    assert got == dict(enumerate(_alone(lm, requests)))


def test_a_cancelled_stream_frees_its_rows_and_the_others_go_on(tiny_llama):
    lm = tiny_llama
    requests = [(PROMPTS[1], Stream(0, JuICE(lm, SEL, 3, -1)), 40, 0), (PROMPTS[4], Stream(0), 12, 1),
                (PROMPTS[3], Stream(0, JuNE(lm, SEL, 1, 0)), 30, 2)]
    session = DecodingSession(lm)
    got, finished = _run(session, lm, requests, cancel_at={0: 4})
    alone = _alone(lm, requests)
    assert 0 not in finished and got[0] == alone[0][:4]   # four steps, then gone
    assert got[1] == alone[1] and got[2] == alone[2]
    session.add("a", token_ids(lm.tokenizer, PROMPTS[1]), Stream(0, JuICE(lm, SEL, 3, -1)), 10)
    session.step()
    assert session.rows == 2   # a JuICE stream: its clean row and its steered row
    session.cancel("a")
    assert session.step() == [] and session.rows == 0 and session.idle


def test_a_stop_predicate_ends_a_stream_the_step_it_holds(tiny_llama):
    session = DecodingSession(tiny_llama, eos=None)
    session.add("s", token_ids(tiny_llama.tokenizer, PROMPTS[1]), Stream(0), 20, stop=lambda toks: len(toks) == 3)
    events = [session.step() for _ in range(3)]
    assert [e[0].finished for e in events] == [None, None, "stop"] and session.idle


def test_bad_streams_are_refused(tiny_llama):
    session = DecodingSession(tiny_llama)
    with pytest.raises(ValueError, match="max_new_tokens"):
        session.add(0, [1, 5], Stream(0), 0)
    with pytest.raises(ValueError, match="empty prompt"):
        session.add(0, [], Stream(0), 3)
    session.add(0, [1, 5], Stream(0), 3)
    with pytest.raises(ValueError, match="already in the session"):
        session.add(0, [1, 6], Stream(0), 3)


def test_prompt_log_probabilities_come_from_the_prefill_and_equal_teacher_forcing(tiny):
    """`prompt_logprobs` (the server's echo) read from a shared, padded prefill equal the uncached
    teacher-forced reference (:func:`juice.engine.likelihood.sequence_logits`) under every steering, for
    a prompt prefilled beside longer and shorter ones and other steerings of itself."""
    from juice.engine.likelihood import sequence_logits

    lm = tiny
    steerings = [ORIGINAL, JuICE(lm, SEL, 3, -1), JuNE(lm, SEL, 1, -0.5)]
    session = DecodingSession(lm)
    asked = {}
    for i, prompt in enumerate(PROMPTS):
        ids = token_ids(lm.tokenizer, prompt)
        steering = steerings[i % 3]
        top = 3 if i % 2 else 0
        session.add(("echo", i), ids, Stream(0, steering), 2, prompt_logprobs=top)
        session.add(("plain", i), ids, Stream(0, steerings[(i + 1) % 3]), 2)   # shares the clean prefill
        asked[i] = (ids, steering, top)
    first = {t.key: t for t in session.step()}
    for i, (ids, steering, top) in asked.items():
        got = first["echo", i].prompt_logprobs
        assert first["plain", i].prompt_logprobs is None
        if len(ids) < 2:
            assert got == ()
            continue
        want = sequence_logits(lm, [ids], [len(ids) - 1], steering)[0].log_softmax(-1)
        chosen = want.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        assert torch.allclose(torch.tensor([c for c, _ in got]), chosen, atol=1e-4), (i, steering.kind)
        for (c, pairs), row in zip(got, want):
            assert len(pairs) == top
            if top:   # the top values (their ids may swap where two are within float noise)
                assert torch.allclose(torch.tensor([v for _, v in pairs]), row.topk(top).values, atol=1e-4)


def test_prompt_log_probabilities_are_refused_with_a_choice(tiny_llama):
    from juice.engine import Choice

    lm = tiny_llama
    ids = token_ids(lm.tokenizer, PROMPTS[0])
    choice = Choice(question=1, candidates=(ORIGINAL, JuNE(lm, SEL, 1, 0)),
                    rule=lambda logits, question: torch.zeros(logits.shape[0], dtype=torch.long))
    with pytest.raises(ValueError, match="a choice is made after it"):
        DecodingSession(lm).add("a", ids, Stream(0, choice=choice), 2, question_ids=ids[:2], prompt_logprobs=1)
