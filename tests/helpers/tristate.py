"""A TriState-Bench folder in the published layout (`<model>/facts/*.jsonl` and the state files,
two lines an input), written from facts, for the tests that read one without ../shared."""

from __future__ import annotations

import json
from pathlib import Path

from juice.data.tristate import STATES, TriStateFact, context_prompt, question_prompt


def write_tristate(folder: Path, facts: list[TriStateFact], model: str = "screened-model") -> Path:
    """Write `facts` (each with both passages) as `folder`/`model`'s pool and state files; return `folder`."""
    root = folder / model
    (root / "facts").mkdir(parents=True, exist_ok=True)
    for answer_type in sorted({f.answer_type for f in facts}):
        rows = [{"fact_id": f.fact_id, "answer_type": f.answer_type, "answer": f.answer, "aliases": list(f.aliases),
                 "questions": list(f.questions), "responses": [], "vote_details": [], "per_q_verdict": [],
                 "rho": 0.0, "prior_state": "P_right"} for f in facts if f.answer_type == answer_type]
        (root / "facts" / f"{answer_type}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows),
                                                            encoding="utf-8")
    for state, stem in STATES.items():
        lines = []
        for k, f in enumerate(facts):
            passage = f.wrong_passage if state == "resistance" else f.right_passage
            extra = {"wrong_answer": f.wrong_answer} if state == "resistance" else {}
            for process, prompt in ((0, context_prompt(passage, f.questions[0])), (1, question_prompt(f.questions[0]))):
                lines.append({"input_index": k, "assigned_process": process, "context_string": prompt,
                              "gold_answers": list(f.aliases), "fact_id": f.fact_id, "answer_type": f.answer_type,
                              "benchmark": stem, **extra})
        (root / f"{stem}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return folder
