"""The steering a request may ask for: one protocol for `juice serve` and for vLLM with juice's plugin.

A request carries a `juice` object (HTTP body field; vLLM also takes the same keys flat in
`vllm_xargs` as `juice_<key>`):

    {"method": "juice", "direction": "context", "beta_plus": 2, "beta_minus": 0}

| field | type | meaning | absent |
|---|---|---|---|
| `method` | string, one of `original`, `ph3`, `june`, `juice`, `auto` (any case; the registry's aliases too) | Original; PH3's pruning of `heads`; JuNE (paper Alg. 4); JuICE (Alg. 1); juice's per-request choice (:mod:`juice.when_to_steer.auto`; juice's own engine only) | the method the direction's heads file holds tuned betas for (JuICE first), else `juice`; `original` on a server without heads files |
| `direction` | string, read by :meth:`juice.data.records.Direction.parse` (`parametric`/`memory`, `contextual`/`context`, any case) | which heads file steers | the only heads file's; an error where the server has two |
| `beta_plus`, `beta_minus` | JSON number (not a boolean, not a string), finite, \\|beta\\| <= 100 | the betas | the heads file's tuned betas for the method (`juice tune`), else 2 and 0 with a warning |
| `heads` | `ph3`: a list of head names (`"L11H2"`) or one string of names separated by commas or spaces; `june`, `juice`: per-head coefficients, an object `{"L11H2": 0.5}` (or, flat in `vllm_xargs`, a list of `"L11H2=0.5"` strings), finite, \\|c\\| <= 100 | `ph3`: the heads it zeroes; `june`, `juice`: explicit coefficients instead of a heads file's heads and betas (JuNE: the live output becomes `(1 + c) H`; JuICE: `c` times run 1's output is added; the vLLM plugin adds only to its heads files' heads) | an error for `ph3`; `june`, `juice`: the heads file's heads and betas; refused with any other method |
| `question` | non-empty string | for `auto`: the question without its context (completions: the question's prompt text; chat: the last user message's content without the context); equal to the prompt: no passage, decoded as Original) | an error for `auto`; refused with any other method |

What each method takes and needs is its registry entry's (:data:`juice.methods.REGISTRY`:
`protocol`, `request_heads`, `question`, `dual_run`, `tuned`), and a request's recipe is built by
the registry (:meth:`SteeringAsk.build`, :func:`juice.methods.build`): a method added to the
registry with `protocol=True` is served by both servers without a change here.

A request without the field (or with an empty object) gets the operator's default steering
(`juice serve --default SPEC`; vLLM: `JUICE_VLLM_DEFAULT`), else the tuned steering of the only
heads file where that file holds tuned betas, else Original: an untuned heads file never steers
a request that did not ask (issue 38). Every refusal is a :class:`SteeringRequestError` whose
one-line message both servers send with HTTP 400; a steering with untuned betas carries a
warning that both servers send in the :data:`WARNING_HEADER` response header.

Decided once for both servers: booleans are not numbers (`"beta_plus": true` is refused);
directions are read as :meth:`Direction.parse` reads them; `ph3` takes explicit heads on both
engines; `june` and `juice` with per-head coefficients (Stage 1's single-head scalings, a
pipeline's own steerings: :mod:`juice.vllm.engine`) take no direction and no betas; an
unknown field is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from juice.architectures import HeadGeometry
from juice.data.records import Direction
from juice.interventions import Head, HeadSelection, check_heads
from juice.methods import (REGISTRY, TUNED_STEERINGS, UNSTEERED, Built, MethodInputs, MethodSpec, build,
                           by_protocol, protocol_names)
from juice.steering import Steering, chosen_betas
from juice.tuned import TunedSettings

FIELDS: tuple[str, ...] = ("method", "direction", "beta_plus", "beta_minus", "heads", "question")
"""The keys of a request's `juice` object."""

MAX_ABS_BETA = 100.0
"""Largest |beta| a request may ask for (the paper's grids stay within 5); far beyond, head
outputs swamp the residual stream and the output is noise."""

WARNING_HEADER = "X-Juice-Warning"
"""The response header that carries a request's steering warning (untuned betas, issue 38)."""

NOT_AN_OBJECT = "juice must be an object with method, direction, beta_plus, beta_minus, heads, question"


class SteeringRequestError(ValueError):
    """A request's steering fields are wrong: both servers answer HTTP 400 with this one line."""


@dataclass(frozen=True)
class ServedHeads:
    """What a server steers with: its heads files, by direction, and its operator's default.

    Attributes:
        selections: direction ("parametric" | "contextual") -> the heads file's selection.
        tuned: direction -> the file's tuned settings (:class:`juice.tuned.TunedSettings`; plain
            objects are read as such).
        default: the `juice` fields a request without any gets (`juice serve --default`,
            `JUICE_VLLM_DEFAULT`), or None (module docstring's rule).
        dual_run: JuICE can run (vLLM: `JUICE_VLLM_DUAL_RUN`); juice's own engine always can.
        geometry: the served model's heads (pruned heads are checked against it), or None.
        files: direction -> the heads file's name, for messages.
        auto: the server runs `auto` (juice's own engine; the vLLM plugin does not: it would
            need a question-only second sequence per request).
    """

    selections: Mapping[str, HeadSelection] = field(default_factory=dict)
    tuned: Mapping[str, TunedSettings] = field(default_factory=dict)
    default: Mapping[str, Any] | None = None
    dual_run: bool = True
    geometry: HeadGeometry | None = None
    files: Mapping[str, str] = field(default_factory=dict)
    auto: bool = True

    @classmethod
    def of_artifacts(cls, artifacts, geometry: HeadGeometry | None = None,
                     default: Mapping[str, Any] | None = None) -> "ServedHeads":
        """From loaded heads files (:func:`juice.load_heads`), at most one per direction.

        Raises:
            ValueError: two heads files for the same direction.
        """
        selections: dict[str, HeadSelection] = {}
        tuned: dict[str, dict] = {}
        for artifact in artifacts:
            d = str(Direction.parse(str(artifact.direction)))
            if d in selections:
                raise ValueError(f"two heads files for the {d} direction")
            selections[d] = artifact.selection
            tuned[d] = TunedSettings.of(getattr(artifact, "tuned", None))
        return cls(selections, tuned, default, True, geometry)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tuned", {d: TunedSettings.of(t) for d, t in self.tuned.items()})

    def addable(self, head: Head) -> bool:
        """Whether JuICE can add to `head` with per-head coefficients: anywhere on juice's own
        engine (its run 1 keeps every head's output); the vLLM plugin overrides it."""
        return True

    def tuned_of(self, direction: str | None) -> TunedSettings:
        """The tuned settings of the heads file of `direction` (empty where it holds none)."""
        return self.tuned.get(direction) or TunedSettings()

    def tuned_method(self, direction: str) -> str | None:
        """The method the heads file of `direction` holds tuned betas for, JuICE first."""
        mine = self.tuned_of(direction)
        return next((m for m in TUNED_STEERINGS if mine.betas(m) is not None), None)

    def default_fields(self) -> dict[str, Any]:
        """The `juice` fields of a request that sends none (module docstring)."""
        if self.default is not None:
            return dict(self.default)
        if len(self.selections) == 1 and (m := self.tuned_method(next(iter(self.selections)))) is not None:
            return {"method": m}
        return {"method": UNSTEERED}


@dataclass(frozen=True)
class SteeringAsk:
    """One request's steering, checked and with its defaults filled in.

    Attributes:
        method: one of :func:`juice.methods.protocol_names` (the registry's name).
        direction: the heads file's direction for the methods that steer with one, else None.
        beta_plus, beta_minus: the betas JuICE and JuNE run with (0 otherwise).
        heads: the heads PH3 zeroes (empty otherwise).
        warning: one line for the client (untuned betas), or None.
        question: auto's question without its context (None otherwise).
        per_head: JuNE's or JuICE's explicit (head, coefficient) pairs, sorted by head, in
            place of a heads file's heads and betas (empty otherwise).
    """

    method: str
    direction: str | None = None
    beta_plus: float = 0.0
    beta_minus: float = 0.0
    heads: tuple[Head, ...] = ()
    warning: str | None = None
    question: str | None = None
    per_head: tuple[tuple[Head, float], ...] = ()
    entry: MethodSpec | None = field(default=None, compare=False, repr=False)
    """The method's registry entry as the request's parse found it (None: looked up by `method`)."""

    @property
    def spec(self) -> MethodSpec:
        """The method's registry entry (:data:`juice.methods.REGISTRY`), found once where the
        request was read (:func:`steering_ask`)."""
        return self.entry if self.entry is not None else REGISTRY[self.method]

    @property
    def steers(self) -> bool:
        """The request changes the model's computation (False: the unmodified model's)."""
        return self.spec.name != UNSTEERED

    def build(self, geometry: HeadGeometry, served: ServedHeads) -> Built:
        """The recipe juice's engine decodes the request with, built by the registry
        (:func:`juice.methods.build`) from the request's fields and the direction's heads file.

        Raises:
            SteeringRequestError: a head outside `geometry`, or a heads file's policy that does
                not parse (the message names `juice.heads` or the heads file); a method whose
                recipe is contrastive or instructed (a registry entry with `protocol=True` that
                the servers cannot decode: refused, never served as Original).
        """
        spec = self.spec
        betas = spec.tuned == "betas" and not self.per_head
        inputs = MethodInputs(geometry, served.selections.get(self.direction) if self.direction else None,
                              served.tuned_of(self.direction), self.beta_plus if betas else None,
                              self.beta_minus if betas else None, pruned=self.heads or None,
                              coefficients=dict(self.per_head) or None)
        try:
            built = build(spec, inputs, warn=False)
        except (ValueError, IndexError) as err:
            where = ("juice.heads" if self.heads or self.per_head
                     else served.files.get(self.direction, "the heads file"))
            raise SteeringRequestError(f"{where}: {err}") from None
        return _servable(spec, built)

    def steering(self, geometry: HeadGeometry, served: ServedHeads) -> Steering:
        """The head steering of :meth:`build`'s recipe (PH3: JuNE with beta = -1 at the zeroed
        heads, :func:`juice.steering.Prune`; Original's for auto, whose candidates are its choice).

        Raises:
            SteeringRequestError: as :meth:`build`.
        """
        return self.build(geometry, served).method.steering


def _servable(spec: MethodSpec, built: Built) -> Built:
    """`built`, unless its recipe decodes with a contrast or an instruction (a registry entry with
    `protocol=True` that the servers cannot decode: refused, never served as Original)."""
    if built.method.decoding == "contrastive stream" or built.method.instructed:
        raise SteeringRequestError(f"juice.method {spec.name} decodes with a contrast or an instruction, which "
                                   "a request's steering does not carry; run it with juice evaluate")
    return built


def juice_fields(value: Any) -> dict[str, Any]:
    """A request's `juice` value as fields: an object whose keys are all in :data:`FIELDS`
    (None: no fields).

    Raises:
        SteeringRequestError: not an object, or an unknown key.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SteeringRequestError(NOT_AN_OBJECT)
    unknown = sorted(str(k) for k in set(value) - set(FIELDS))
    if unknown:
        raise SteeringRequestError(f"unknown juice field {unknown[0]!r}; the fields are {', '.join(FIELDS)}")
    return dict(value)


def request_fields(extra_args: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The juice fields of a request's `extra_args` (vLLM's `SamplingParams.extra_args`, the
    `vllm_xargs` of its OpenAI server, or `juice serve`'s body): the nested `juice` object, and the
    flat `juice_*` keys over it; None when there are none.

    Raises:
        SteeringRequestError: `juice` is not an object, or an unknown `juice_*` / `juice` key.
    """
    if not extra_args:
        return None
    fields: dict[str, Any] = {}
    if "juice" in extra_args:
        if not isinstance(extra_args["juice"], Mapping):
            raise SteeringRequestError(NOT_AN_OBJECT)
        fields.update(extra_args["juice"])
    if "juice_invalid" in extra_args:   # the middleware's mark for a `juice` body field that is not an object
        raise SteeringRequestError(NOT_AN_OBJECT)
    for key, value in extra_args.items():
        if key.startswith("juice_"):
            fields[key[len("juice_"):]] = value
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise SteeringRequestError(f"unknown juice field {unknown[0]!r}; the fields are {', '.join(FIELDS)}")
    return fields if ("juice" in extra_args or fields) else None


def _text(fields: Mapping[str, Any], key: str, choices: str | Callable[[], str]) -> str | None:
    """`fields[key]` stripped and lower-cased, None where absent; `choices` (or the function that
    gives them, called only for the message) says what it must be.

    Raises:
        SteeringRequestError: a value that is not a string."""
    value = fields.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise SteeringRequestError(f"juice.{key} must be {choices() if callable(choices) else choices}, "
                                   f"not {value!r}")
    return value.strip().lower()


def _beta(fields: Mapping[str, Any], key: str) -> float | None:
    value = fields.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SteeringRequestError(f"juice.{key} must be a number, not {value!r}")
    beta = float(value)
    if not math.isfinite(beta) or abs(beta) > MAX_ABS_BETA:
        raise SteeringRequestError(f"juice.{key} must be finite with |beta| <= {MAX_ABS_BETA:g}, not {value!r}")
    return beta


def _per_head(value: Any, spec: MethodSpec, served: ServedHeads) -> tuple[tuple[Head, float], ...]:
    """A method's explicit per-head coefficients (its `request_heads` is "coefficients"): an object
    {head name: number} or a list of "NAME=NUMBER" strings (the flat `vllm_xargs` form), sorted by head."""
    form = "an object of head names and coefficients, e.g. {\"L11H2\": 0.5}"
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and "=" in v for v in value):
        pairs = []
        for item in value:
            name, _, number = item.partition("=")
            try:
                pairs.append((name, float(number)))
            except ValueError:
                raise SteeringRequestError(f"juice.heads: {item!r} is not NAME=NUMBER") from None
    else:
        raise SteeringRequestError(f"juice.method {spec.name} takes juice.heads as {form}, not {value!r}")
    if not pairs:
        raise SteeringRequestError(f"juice.heads is empty; send {form}")
    out: dict[Head, float] = {}
    for name, number in pairs:
        if not isinstance(name, str):
            raise SteeringRequestError(f"juice.heads: {name!r} is not a head name like 'L11H2'")
        key = f"heads.{name}"
        beta = _beta({key: number}, key)
        if beta is None:
            raise SteeringRequestError(f"juice.{key} must be a number, not None")
        try:
            head = Head.parse(name)
            if served.geometry is not None:
                check_heads([head], served.geometry)
        except (ValueError, IndexError) as err:
            raise SteeringRequestError(f"juice.heads: {err}") from None
        if head in out:
            raise SteeringRequestError(f"juice.heads names {head} twice")
        if spec.dual_run and beta and not served.addable(head):
            raise SteeringRequestError(f"juice.heads: JuICE adds only to heads whose run-1 outputs this server keeps "
                                       f"(its heads files' heads); {head} is not one")
        out[head] = float(beta)
    return tuple(sorted(out.items()))


def _heads(value: Any, spec: MethodSpec, geometry: HeadGeometry | None) -> tuple[Head, ...]:
    """The heads a method zeroes (its `request_heads` is "zero"): a list of head names or one
    string of names separated by commas or spaces."""
    names = [n for n in value.replace(",", " ").split() if n] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise SteeringRequestError(f"juice.method {spec.name} needs juice.heads, a list of head names like 'L11H2'")
    try:
        heads = tuple(Head.parse(n) for n in names)
        if geometry is not None:
            check_heads(heads, geometry)
    except (ValueError, IndexError) as err:
        raise SteeringRequestError(f"juice.heads: {err}") from None
    return heads


def read_steering(value: Any, served: ServedHeads) -> SteeringAsk:
    """Check one request's `juice` value against what the server steers with, and fill in the
    defaults (module docstring's table).

    Args:
        value: the request's `juice` object (None or {}: none was sent).
        served: the server's heads files and default.

    Returns:
        the request's :class:`SteeringAsk`.

    Raises:
        SteeringRequestError: the first thing wrong, in this order: not an object, an unknown
            field, an unknown method, `heads` with a method other than ph3, june or juice, ph3
            without heads or with a head that does not parse or lies outside the model, `question`
            without auto, auto where it is not served, a direction that does not parse, has no
            heads file or is missing where the server has two, auto with betas, without a
            question or without a tuned policy, JuICE without the dual run, a beta that is not
            a finite number with |beta| <= 100.
    """
    return steering_ask(juice_fields(value), served)


def steering_ask(fields: Mapping[str, Any], served: ServedHeads) -> SteeringAsk:
    """:func:`read_steering` for fields already read by :func:`juice_fields` (juice serve's
    admission reads a request's `juice` value once and merges its alias's fields, checked at
    start): `{}` gets the server's default.

    Raises:
        SteeringRequestError: as :func:`read_steering`, after the object and key checks.
    """
    fields = fields or juice_fields(served.default_fields())
    given_method = _text(fields, "method", lambda: "one of " + ", ".join(protocol_names()))
    spec = None
    if given_method is not None:
        try:
            spec = by_protocol(given_method)
        except ValueError:
            raise SteeringRequestError(f"juice.method must be one of {', '.join(protocol_names())}, "
                                       f"not {fields['method']!r}") from None
    for key in ("beta_plus", "beta_minus"):   # a malformed beta is named first, before what else the request lacks
        _beta(fields, key)
    if "heads" in fields and (spec is None or spec.request_heads is None):
        takers = [n for n in protocol_names() if REGISTRY[n].request_heads]
        raise SteeringRequestError(f"juice.heads is for methods {', '.join(takers)} (the heads PH3 zeroes, or "
                                   "per-head coefficients)")
    if "question" in fields and (spec is None or not spec.question):
        askers = [n for n in protocol_names() if REGISTRY[n].question]
        raise SteeringRequestError(f"juice.question is for method {', '.join(askers)}")
    if spec is not None and spec.question and not served.auto:
        raise SteeringRequestError(f"juice.method {spec.name} is not served here: it decodes a question-only second "
                                   "sequence per request, which the vLLM plugin does not run; use juice serve")
    if spec is not None and not spec.heads:   # built now: it needs nothing of the model
        _servable(spec, build(spec, MethodInputs(), warn=False))
        return SteeringAsk(spec.name, entry=spec)
    if spec is None and not served.selections and not {"direction", "beta_plus", "beta_minus"} & set(fields):
        return SteeringAsk(UNSTEERED)
    if spec is not None and spec.request_heads == "zero":
        return SteeringAsk(spec.name, heads=_heads(fields.get("heads"), spec, served.geometry), entry=spec)
    if "heads" in fields:   # a method with explicit per-head coefficients
        if {"direction", "beta_plus", "beta_minus"} & set(fields):
            raise SteeringRequestError("juice.heads with coefficients replaces the heads file's heads and betas: "
                                       "send no direction or betas")
        _needs_dual_run(spec, served)
        return SteeringAsk(spec.name, per_head=_per_head(fields["heads"], spec, served), entry=spec)
    given = _text(fields, "direction", "parametric (memory) or contextual (context)")
    if given is None:
        if len(served.selections) != 1:
            raise SteeringRequestError(f"say juice.direction: this server has heads for "
                                       f"{sorted(served.selections) or 'no direction'}")
        direction = next(iter(served.selections))
    else:
        try:
            direction = str(Direction.parse(given))
        except ValueError as err:
            raise SteeringRequestError(f"juice.direction: {err}") from None
        if direction not in served.selections:
            raise SteeringRequestError(f"no heads for direction {direction!r}; this server has "
                                       f"{sorted(served.selections) or 'none'}")
    if spec is not None and spec.question:
        if {"beta_plus", "beta_minus"} & set(fields):
            raise SteeringRequestError(f"juice.method {spec.name} chooses its own strength: send no betas")
        question = fields.get("question")
        if not isinstance(question, str) or not question.strip():
            raise SteeringRequestError(f"juice.method {spec.name} needs juice.question, the question without its "
                                       "context")
        if spec.tuned == "policy" and served.tuned_of(direction).auto is None:
            raise SteeringRequestError(f"{served.files.get(direction, 'the ' + direction + ' heads file')} holds no "
                                       f"{spec.name} policy: run `juice tune --methods {spec.name}` with validation "
                                       "data")
        return SteeringAsk(spec.name, direction, question=question, entry=spec)
    spec = spec or REGISTRY[served.tuned_method(direction) or TUNED_STEERINGS[0]]
    _needs_dual_run(spec, served)
    bp, bm = _beta(fields, "beta_plus"), _beta(fields, "beta_minus")
    bp, bm, warning = chosen_betas(spec.name, served.tuned_of(direction), bp, bm)
    return SteeringAsk(spec.name, direction, bp, bm, warning=warning, entry=spec)


def _needs_dual_run(spec: MethodSpec, served: ServedHeads) -> None:
    if spec.dual_run and not served.dual_run:
        single = next(n for n in protocol_names() if REGISTRY[n].steers and not REGISTRY[n].dual_run
                      and REGISTRY[n].tuned == "betas")
        raise SteeringRequestError(f"juice.method {spec.name} needs the dual run; this server was started without it "
                                   f"(JUICE_VLLM_DUAL_RUN=0); use {single}")


def parse_spec(spec: str, label: str = "--default") -> dict[str, Any]:
    """`key:value` pairs joined by commas (`juice serve --default`, `--alias`, `JUICE_VLLM_DEFAULT`),
    e.g. `method:juice,beta_plus:2` -> {"method": "juice", "beta_plus": 2.0}. Betas are read as
    numbers; `heads:L1H1 L2H0` as a list.

    Raises:
        ValueError: a pair without `:`, or a beta that is not a number (the message quotes
            `label`).
    """
    options: dict[str, Any] = {}
    for pair in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = pair.partition(":")
        if not sep or not key.strip():
            raise ValueError(f"{label}: {pair!r} is not key:value")
        key, value = key.strip(), value.strip()
        if key in ("beta_plus", "beta_minus"):
            try:
                options[key] = float(value)
            except ValueError:
                raise ValueError(f"{label}: {key} must be a number, not {value!r}") from None
        elif key == "heads":
            options[key] = value.split()
        else:
            options[key] = value
    return options


def __getattr__(name: str):
    """`METHODS`: what a request may ask for, read from :data:`juice.methods.REGISTRY` when asked
    (:func:`juice.methods.protocol_names`; no copy at import)."""
    if name == "METHODS":
        return protocol_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FIELDS", "MAX_ABS_BETA", "METHODS",   # noqa: F822 (METHODS is read lazily by __getattr__)
           "NOT_AN_OBJECT", "ServedHeads", "SteeringAsk", "SteeringRequestError", "WARNING_HEADER", "juice_fields", "parse_spec", "read_steering", "request_fields", "steering_ask"]
