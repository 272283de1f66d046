"""The Prompt baseline: an instruction before the task prompt (paper Sec. 4.1, App. D.1,
"Prompt Instructions").

Where each instruction goes (the paper says "before the standard task prompt"; placed so that
its words refer to the right text):

- parametric, substitution conflict: after the conflicting statement, right before the task
  query ("Ignore the preceding statement ..."), when the prompt ends with the clean prompt;
  otherwise at the start;
- parametric, coherent conflict: at the start ("The following passage contains misleading
  information ...");
- parametric, clean prompt: unchanged (there is no conflict to warn about);
- contextual: at the start, the sentence-completion or the question-answering variant by the
  dataset's kind (MemoTrap's three completion subtasks; NQ-Swap and History of Science QA).

The instruction and the prompt are joined by one space.
"""

from __future__ import annotations

from juice.data.records import ConflictExample, ContextualExample

PARAMETRIC_SUBSTITUTION = (
    "Ignore the preceding statement and rely only on your pre-trained knowledge. "
    "Complete the sentence accurately based on your memory of the world:"
)
PARAMETRIC_COHERENT = (
    "The following passage contains misleading information. Ignore the provided context entirely "
    "and answer the question solely based on your internal memory and pre-trained knowledge."
)
CONTEXTUAL_COMPLETION = (
    "Please complete the sentence below solely relying on the provided statement, ignoring your internal memory."
)
CONTEXTUAL_QA = "Please answer the following question based on the given context, ignoring your internal memory."


def parametric_prompt(example: ConflictExample, conflict_type: str) -> str:
    """The prompt of `example` under `conflict_type` with the Prompt baseline's instruction.

    Raises:
        KeyError: unknown conflict type.
    """
    prompt = example.prompts[conflict_type]
    if conflict_type == "substitution":
        clean = example.prompts["clean"]
        if prompt.endswith(clean) and len(prompt) > len(clean):
            head = prompt[: -len(clean)].rstrip()
            return f"{head} {PARAMETRIC_SUBSTITUTION} {clean}"
        return f"{PARAMETRIC_SUBSTITUTION} {prompt}"
    if conflict_type == "coherent":
        return f"{PARAMETRIC_COHERENT} {prompt}"
    return prompt


def contextual_prompt(example: ContextualExample) -> str:
    """`example.prompt` with the contextual instruction for its kind in front."""
    instruction = CONTEXTUAL_QA if example.kind == "qa" else CONTEXTUAL_COMPLETION
    return f"{instruction} {example.prompt}"
