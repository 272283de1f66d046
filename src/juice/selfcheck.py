"""The load-time self-check: a model whose tokenizer or weights loaded wrong is refused, never run.

With transformers 5.17 the embedded Gemma GGUF's tokenizer converts wrongly (no BOS, other ids;
every continuation " 1 1 1 1"), and nothing failed until a pipeline's filter found no known item
(issue 14). :func:`check_loaded_model`, called by :func:`juice.models.load_model`, checks:

1. the tokenizer round-trips a fixed sentence (decode(encode(s)) == s, white space collapsed),
   gives ids inside the model's vocabulary and no unknown token;
2. the ids start with BOS where the architecture needs it (Gemma's families: without BOS their
   output is garbage);
3. for the embedded aliases, the fixed sentence's ids are the known ones and a canary prompt
   ("Monday, Tuesday, Wednesday, Thursday,") gives its known next token (" Friday") with
   probability >= `CANARY_MIN_PROB` (0.83 for Gemma 3 270M and 0.91 for SmolLM2-135M measured
   with transformers 5.23; 0.37 for Qwen2.5-Coder-1.5B-Instruct, fp32, with 5.24).

A failure raises :class:`ModelLoadError` with one line naming the check and the likely cause
(the transformers / gguf versions). `load_model(..., self_check=False)` skips it.
"""

from __future__ import annotations

import torch

SENTENCE = "The name of the capital city of France is Paris."
CANARY_PROMPT = "Monday, Tuesday, Wednesday, Thursday,"
CANARY_MIN_PROB = 0.2
BOS_REQUIRED = ("gemma", "gemma2", "gemma3", "gemma3_text")
"""model_types whose output is garbage without BOS."""

KNOWN = {
    "gemma-3-270m": {"sentence_ids": [2, 818, 1463, 529, 506, 5279, 3207, 529, 7001, 563, 9079, 236761],
                     "canary_token": 7672},
    "smollm2-135m": {"sentence_ids": [504, 1462, 282, 260, 3575, 2240, 282, 4649, 314, 7042, 30],
                     "canary_token": 11655},
    "qwen2.5-coder-1.5b": {"sentence_ids": [785, 829, 315, 279, 6722, 3283, 315, 9625, 374, 12095, 13],
                           "canary_token": 6602},
}
"""The embedded aliases' token ids of SENTENCE and of " Friday", measured with transformers 5.23
(Qwen2.5-Coder-1.5B with 5.24: no BOS, as its tokenizer has none)."""


class ModelLoadError(RuntimeError):
    """The model or its tokenizer loaded wrong (see the message for the check that failed)."""


def _versions() -> str:
    import importlib.metadata as md

    out = []
    for pkg in ("transformers", "tokenizers", "gguf", "torch"):
        try:
            out.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            pass
    return ", ".join(out)


def _fail(name: str, what: str) -> ModelLoadError:
    return ModelLoadError(f"{name}: {what}; the tokenizer or weights loaded wrong, most likely a package version "
                          f"({_versions()}; the README lists the floors). load_model(..., self_check=False) skips "
                          f"this check")


def check_tokenizer(tokenizer, model_type: str, vocab_size: int | None, name: str = "model") -> list[int]:
    """Checks 1 and 2 of the module docstring.

    Returns:
        The ids of SENTENCE.

    Raises:
        ModelLoadError: a check fails.
    """
    ids = list(tokenizer(SENTENCE, add_special_tokens=True)["input_ids"])
    if not ids:
        raise _fail(name, "the tokenizer gives no token for a plain sentence")
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if " ".join(text.split()) != SENTENCE:
        raise _fail(name, f"the tokenizer does not round-trip {SENTENCE!r} (got {text!r})")
    if vocab_size is not None and max(ids) >= vocab_size:
        raise _fail(name, f"token id {max(ids)} lies outside the model's vocabulary of {vocab_size}")
    unk = tokenizer.unk_token_id
    if unk is not None and unk in ids[1:] and unk != tokenizer.bos_token_id:
        raise _fail(name, "the tokenizer maps plain words to the unknown token")
    if model_type in BOS_REQUIRED and ids[0] != tokenizer.bos_token_id:
        raise _fail(name, f"{model_type} needs BOS (id {tokenizer.bos_token_id}) first, the tokenizer gives {ids[:4]}")
    return ids


@torch.inference_mode()
def check_loaded_model(lm, alias: str | None = None) -> None:
    """The whole self-check (module docstring) of a loaded model; `alias` names an embedded model.
    Of a :class:`juice.models.DeferredModel` whose weights are not loaded yet, the tokenizer's
    checks only (its loading runs the canary).

    Raises:
        ModelLoadError: a check fails.
    """
    config = lm.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config   # multimodal wrappers
    model_type = config.model_type if config.model_type in BOS_REQUIRED else text.model_type
    ids = check_tokenizer(lm.tokenizer, model_type, getattr(text, "vocab_size", None), lm.name)
    known = KNOWN.get(alias or "")
    if known is None or not lm.loaded:
        return
    if ids != known["sentence_ids"]:
        raise _fail(lm.name, f"the tokenizer gives {ids[:6]}... for a fixed sentence, not the known "
                             f"{known['sentence_ids'][:6]}...")
    prompt = torch.tensor([lm.tokenizer(CANARY_PROMPT)["input_ids"]], device=lm.device)
    probs = lm.model(input_ids=prompt).logits[0, -1].float().softmax(-1)
    p = float(probs[known["canary_token"]])
    if not p >= CANARY_MIN_PROB:   # also catches NaN
        raise _fail(lm.name, f"the canary {CANARY_PROMPT!r} -> ' Friday' has probability {p:.3f} "
                             f"(< {CANARY_MIN_PROB}; the sound embedded models give 0.37 to 0.91)")


__all__ = ["CANARY_MIN_PROB", "CANARY_PROMPT", "KNOWN", "ModelLoadError", "SENTENCE", "check_loaded_model",
           "check_tokenizer"]
