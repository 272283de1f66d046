"""The Prompt baseline (paper Sec. 4.1, App. D.1, "Prompt Instructions"): an instruction
prepended to the whole task prompt, in the forms the paper's authors apply
(`../shared/docs/protocol.md`, "Prompt baseline", both directions):

- parametric, substitution conflict: `"<instruction> <substitution prompt>"`;
- parametric, coherent conflict: `"<instruction> Context: <coherent prompt>"`;
- parametric, clean prompt: unchanged;
- Phi-2 (`model_type` "phi"), as the authors' code has it: a line break instead of the space
  after the substitution instruction and after the coherent form's "Context:"
  (:data:`INSTRUCTION_BREAK`);
- contextual, the three MemoTrap completion subtasks (Proverb Ending, Proverb Translation,
  Hate Speech Ending): the completion instruction, a line break, then the prompt;
- contextual, History of Science QA: the question-answering instruction, which ends in
  "Question: ", directly before the prompt;
- contextual, NQ-Swap: the NQ-Swap instruction, a line break, `Context: <passage>`, a line
  break, `Question: <question>`, a line break and `Answer:`.

The contextual form is picked by what the record says, never by its dataset's name: the NQ-Swap
form when its metric's `prompt_form` is "question" (:data:`juice.data.metrics.METRICS`), otherwise
the form of its `kind` (MemoTrap's loader gives History of Science QA "qa" and the other three
"completion", :data:`juice.data.memotrap.KIND`; your own rows say theirs).

NQ-Swap: passage and question are recovered from our prompt
(`Context: <passage>\\nQuestion: <question>?\\nAnswer:`, :mod:`juice.data.nqswap`) with the
example's question-only prompt as the anchor, so a "Question:" inside a passage cannot split it.
The question keeps the "?" our loader gives it, so the instructed prompt differs from the plain
one by the instruction alone.
"""

from __future__ import annotations

import re

from juice.data.context_types import ContextItem
from juice.data.metrics import METRICS
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
CONTEXTUAL_QA = (
    "Please answer the following question based on the given context, ignoring your internal memory. Question: "
)
CONTEXTUAL_NQSWAP = "Please answer the question based on the given context, ignoring your internal memory."


_QUESTION = re.compile(r"\AQuestion: (?P<question>[^\n]*)\nAnswer:\Z")
_NQSWAP = re.compile(r"\AContext: (?P<passage>.*)\nQuestion: (?P<question>[^\n]*)\nAnswer:\Z", re.DOTALL)


INSTRUCTION_BREAK: dict[str, str] = {"phi": "\n"}
"""model_type -> what follows the substitution instruction and the coherent form's "Context:"
instead of a space. The authors' code uses a line break for Phi-2 ("without \n, the model
hallucinates"; GaotangLi/JUICE `src/inference_utils.py`, lines 1266-1269)."""


def instructed_parametric(prompt: str, conflict_type: str, model_type: str | None = None) -> str:
    """`prompt` (of `conflict_type`) with the parametric Prompt baseline's instruction, in the
    form the authors use for `model_type` (module docstring).

    >>> instructed_parametric("The capital of France is", "clean")
    'The capital of France is'
    >>> print(instructed_parametric("X is Rome. The capital of X is", "substitution", "phi")[-65:])
    based on your memory of the world:
    X is Rome. The capital of X is

    Raises:
        KeyError: a conflict type other than clean, substitution or coherent.
    """
    sep = INSTRUCTION_BREAK.get(model_type or "", " ")
    if conflict_type == "substitution":
        return f"{PARAMETRIC_SUBSTITUTION}{sep}{prompt}"
    if conflict_type == "coherent":
        return f"{PARAMETRIC_COHERENT} Context:{sep}{prompt}"
    if conflict_type == "clean":
        return prompt
    raise KeyError(conflict_type)


def parametric_prompt(example: ConflictExample, conflict_type: str, model_type: str | None = None) -> str:
    """The prompt of `example` under `conflict_type` with the Prompt baseline's instruction
    (:func:`instructed_parametric`; `model_type` picks the authors' per-model form).

    Raises:
        KeyError: unknown conflict type.
    """
    return instructed_parametric(example.prompts[conflict_type], conflict_type, model_type)


def nqswap_parts(example: ContextualExample) -> tuple[str, str]:
    """(passage, question) of an NQ-Swap prompt `Context: <passage>\\nQuestion: <question>\\nAnswer:`.

    The example's question-only prompt, when it is the prompt's tail, fixes where the passage
    ends; otherwise the last "\\nQuestion: " line does.

    Raises:
        ValueError: the prompt does not have that layout.
    """
    prompt, tail = example.prompt, example.question
    q = _QUESTION.match(tail)
    if q and prompt.startswith("Context: ") and prompt.endswith("\n" + tail):
        return prompt[len("Context: "): -len(tail) - 1], q["question"]
    m = _NQSWAP.match(prompt)
    if m is None:
        raise ValueError(f"{example.dataset}/{example.uid}: not an NQ-Swap prompt "
                         f"('Context: ...\\nQuestion: ...\\nAnswer:'): {prompt[:80]!r}")
    return m["passage"], m["question"]


def contextual_prompt(example: ContextualExample) -> str:
    """`example.prompt` in the authors' instructed form for its metric and kind (module docstring).

    Raises:
        ValueError: an NQ-Swap example whose prompt is not `Context: ...\\nQuestion: ...\\nAnswer:`.
    """
    if METRICS[example.metric].prompt_form == "question":
        passage, question = nqswap_parts(example)
        return f"{CONTEXTUAL_NQSWAP}\nContext: {passage}\nQuestion: {question}\nAnswer:"
    if example.kind == "qa":
        return f"{CONTEXTUAL_QA}{example.prompt}"
    return f"{CONTEXTUAL_COMPLETION}\n{example.prompt}"


def instructed_request(prompt: str, question: str, model_type: str | None = None) -> str:
    """A request's prompt with the Prompt baseline's instruction toward memory, as
    :func:`instructed_context_item` gives a context-type item's (parametric): the authors'
    coherent-conflict form (`<instruction> Context: <prompt>`) where the request has a passage
    (its prompt differs from its question, the question without the passage), the prompt
    unchanged where it has none. What `auto`'s "prompt-mem" candidate decodes
    (:data:`juice.engine.INSTRUCTED`)."""
    if prompt == question:
        return prompt
    return instructed_parametric(prompt, "coherent", model_type)


def instructed_context_item(item: ContextItem, direction: str, model_type: str | None = None) -> str:
    """A context-type item's prompt (:mod:`juice.data.context_types`) with the Prompt baseline's
    instruction of `direction`, in the authors' nearest form (juice's extension: the paper
    instructs conflicting items only). The instruction never depends on the context type or on
    which conflict a passage holds, which a deployed system does not know: only on whether the
    request has a passage (its prompt differs from its question), which it does.

    - contextual: NQ-Swap's instruction and a line break before the prompt (`Context: ...`, or
      the question alone for none); ParaConflict: the completion instruction and a line break;
    - parametric: the authors' coherent-conflict form (`<instruction> Context: <prompt>`) for
      every prompt with a passage, gold, conflicting (substitution and coherent alike) and
      irrelevant; a prompt without one unchanged. This differs from Table 1 (the paper's Table 3)
      (:func:`instructed_parametric`), whose substitution prompts get the substitution
      instruction: there the conflict type is the table's column, known by construction.

    Raises:
        ValueError: a direction other than parametric or contextual.
    """
    if direction == "contextual":
        head = CONTEXTUAL_NQSWAP if METRICS[item.metric].prompt_form == "question" else CONTEXTUAL_COMPLETION
        return f"{head}\n{item.prompt}"
    if direction == "parametric":
        return instructed_request(item.prompt, item.question, model_type)
    raise ValueError(f"direction must be parametric or contextual, not {direction!r}")
