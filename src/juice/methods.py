"""Every method juice runs, in one table: its name, aliases, table title, what it needs and how
it becomes the recipe a table row is decoded with (:class:`juice.recipe.Method`).

The Steerer (:class:`juice.Steerer`), `juice evaluate` (rows and `--contexts`), `juice tune`,
`juice reproduce`'s tables, the context-type study and both servers' request protocol
(:mod:`juice.steering_request`) read their vocabularies and build their methods here. Adding a
method is one :class:`MethodSpec` in :data:`REGISTRY` plus its implementation (a steering preset
in :mod:`juice.steering`, a baseline in :mod:`juice.baselines`). A method implemented above the
registry (it builds through it) registers itself as a plugin would: :func:`register` from a
function named in the `juice.methods` entry-point group (:data:`PLUGIN_GROUP`), which the registry
calls the first time it is listed or asked for a name it lacks. juice's own `auto` registers so
(:func:`juice.when_to_steer.auto.register`); another package adds a method the same way, without
editing juice.

| name | title | paper / source | needs |
|---|---|---|---|
| `original` | Original | the unmodified model | nothing |
| `prompt` | Prompt | App. D.1 (an instruction before the prompt) | nothing |
| `cad` | CAD | Shi et al. 2024, alpha = 1 | a passage (contextual) |
| `adacad` | AdaCAD | Wang et al. 2025, alpha = JSD in bits | a passage (contextual) |
| `ckplug` | CK-PLUG | Bi et al., ICLR 2026, adaptive (:mod:`juice.baselines.ckplug`) | a passage (contextual) |
| `cocoa` | CoCoA | TriState-Bench's version (:mod:`juice.baselines.cocoa`) | a passage (contextual) |
| `coiecd` | COIECD | Yuan et al. 2024, TriState-Bench's copy (:mod:`juice.baselines.coiecd`) | a passage (contextual) |
| `grd` | GRD | TriState-Bench's gated reversal decoding (:mod:`juice.baselines.grd`) | a passage (contextual) |
| `ph3` (`prune`) | PH3 | Jin et al. 2024: zero k heads | heads file with PH3's tuned k, or explicit heads |
| `june` | JuNE | Alg. 4 (one run) | heads file; betas (tuned, given, else :data:`~juice.steering.DEFAULT_BETAS`) |
| `juice` | JuICE | Alg. 1 (dual run) | heads file; betas (as JuNE) |
| `auto` | auto | juice's per-request choice (:mod:`juice.when_to_steer.auto`, a plugin) | heads file with a tuned policy; each request's question |
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from juice.architectures import HeadGeometry
from juice.baselines.cad import CadPolicy, jsd_alpha
from juice.baselines.ckplug import CkPlugPolicy
from juice.baselines.cocoa import CocoaPolicy
from juice.baselines.coiecd import CoiecdPolicy
from juice.baselines.grd import GrdPolicy
from juice.interventions import Head, HeadSelection
from juice.models import LoadedModel
from juice.recipe import Method
from juice.steering import ORIGINAL, PRESETS, PerHead, Prune, UntunedBetasWarning, chosen_betas
from juice.tuned import TunedSettings

TABLES = ("table1", "table2")
"""The paper's tables a method can be a row of: Table 1 (the parametric direction, ParaConflict's
domains) and Table 2 (the contextual direction, MemoTrap and NQ-Swap)."""

SHORT = {"parametric": "mem", "contextual": "ctx"}
"""A direction's suffix on a heads method's title where both directions are evaluated ("JuICE-ctx")."""


@dataclass(frozen=True)
class MethodInputs:
    """What a method is built from.

    Attributes:
        model: the loaded model (or, for head steerings only, its head geometry).
        selection: the heads file's heads, or None (no heads file).
        tuned: the heads file's tuned settings (:attr:`juice.stage1.HeadsArtifact.tuned`; a
            plain object is read as :class:`juice.tuned.TunedSettings`).
        beta_plus, beta_minus: betas the caller gives (None: the tuned ones, else the defaults).
        pruned: PH3's heads to zero, given (per domain, or a request's `heads`); None: the
            heads file's tuned list.
        coefficients: JuNE's or JuICE's explicit per-head coefficients (a request's `heads`), in
            place of the heads file's heads and betas; None: those.
        instruction: the Prompt baseline's instruction where the evaluation does not say it
            ("parametric" | "contextual", :class:`juice.recipe.Method`).
    """

    model: LoadedModel | HeadGeometry | None = None
    selection: HeadSelection | None = None
    tuned: TunedSettings = field(default_factory=TunedSettings)
    beta_plus: float | None = None
    beta_minus: float | None = None
    pruned: Sequence[Head] | None = None
    coefficients: Mapping[Head, float] | None = None
    instruction: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tuned", TunedSettings.of(self.tuned))

    @property
    def geometry(self) -> HeadGeometry:
        return self.model if isinstance(self.model, HeadGeometry) else self.model.geometry


@dataclass(frozen=True)
class Built:
    """A method ready to run: the recipe, the settings it ran with (for reports), and the
    one-line warning to show (untuned betas), or None."""

    method: Method
    settings: dict[str, Any] = field(default_factory=dict)
    warning: str | None = None


@dataclass(frozen=True)
class MethodSpec:
    """One method in :data:`REGISTRY`.

    Attributes:
        name: its name everywhere (CLI `--methods`, `juice.Steerer(method=...)`, files).
        title: its row in tables.
        build: :class:`MethodInputs` -> :class:`Built`.
        aliases: other names accepted for it (any case), on the command line and in requests.
        protocol: a request may ask for it (:mod:`juice.steering_request`), by its name.
        heads: it steers heads, so it needs a heads file (or, for PH3, explicit heads).
        tuned: what a heads file must hold for it: None, "betas" (optional: defaults with a
            warning), "k" (PH3's, required) or "policy" (auto's, required).
        tune: `juice tune` chooses its settings.
        rows: `juice evaluate` runs it on your rows (auto needs each row's question: contexts only).
        steerer: :class:`juice.Steerer` runs it.
        steering: the kind of :class:`juice.steering.Steering` its run uses
            (:data:`juice.steering.SteeringKind`: "none"; "scale": one run; "add": the dual run),
            None where it is not a head steering (Prompt, CAD, AdaCAD: Original's steering with
            their own decoding; auto: Original's, its choice holds the candidates).
        request_heads: what a request's `heads` field is for it: "zero" (PH3: the heads it zeroes,
            required), "coefficients" (JuNE, JuICE: per-head coefficients in place of a heads
            file's heads and betas, optional), None (refused).
        question: a request must send its question without the context (`auto`'s second sequence).
        per_instruction: the context-type evaluation runs it once per instruction
            ("-mem" and "-ctx" rows; the Prompt baseline).
        summary: one line for help texts.
        tables: the paper's tables it is a row of (:data:`TABLES`: "table1", the parametric
            direction's; "table2", the contextual direction's), in registry order, where
            `juice reproduce`, `juice sweep` and the golden runs read their rows
            (:func:`table_methods`; PH3 gives its PH3-l and PH3-s rows there). A method other
            than Original and the tuned steerings is a baseline row: it runs with the baselines.
    """

    name: str
    title: str
    build: Callable[[MethodInputs], Built]
    aliases: tuple[str, ...] = ()
    protocol: bool = False
    heads: bool = False
    tuned: str | None = None
    tune: bool = False
    rows: bool = True
    steerer: bool = False
    steering: str | None = None
    per_instruction: bool = False
    summary: str = ""
    request_heads: str | None = None
    question: bool = False
    tables: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [t for t in self.tables if t not in TABLES]
        if unknown:
            raise ValueError(f"method {self.name}: no table {unknown[0]!r} ({', '.join(TABLES)})")

    @property
    def baseline(self) -> bool:
        """A table row that runs only with the baselines (`ReproduceConfig.baselines`): every
        method but Original and the tuned steerings (JuNE, JuICE)."""
        return self.name != UNSTEERED and self.tuned != "betas"

    @property
    def dual_run(self) -> bool:
        """Its run is the paper's dual run (JuICE, Alg. 1): it needs a server that keeps run 1."""
        return self.steering == "add"

    @property
    def steers(self) -> bool:
        """Its run changes head outputs (PH3, JuNE, JuICE)."""
        return self.steering not in (None, "none")


def _method(*args, **kwargs) -> Method:
    return Method(*args, **kwargs)


def _original(x: MethodInputs) -> Built:
    return Built(_method(ORIGINAL))


def _prompt(x: MethodInputs) -> Built:
    return Built(_method(ORIGINAL, instructed=True, instruction=x.instruction))


def _cad(x: MethodInputs) -> Built:
    return Built(_method(contrast=CadPolicy(1.0)), {"alpha": 1.0})


def _adacad(x: MethodInputs) -> Built:
    return Built(_method(contrast=CadPolicy(jsd_alpha)), {"alpha": "JSD (bits)"})


def _ckplug(x: MethodInputs) -> Built:
    return Built(_method(contrast=CkPlugPolicy()), {"mode": "adaptive"})


def _cocoa(x: MethodInputs) -> Built:
    p = CocoaPolicy()
    return Built(_method(contrast=p), {"global_alpha": p.global_alpha, "gamma": p.gamma, "lambda_pm": p.lambda_pm})


def _coiecd(x: MethodInputs) -> Built:
    p = CoiecdPolicy()
    return Built(_method(contrast=p), {"alpha": p.alpha, "threshold_ratio": p.threshold_ratio})


def _grd(x: MethodInputs) -> Built:
    p = GrdPolicy()
    return Built(_method(contrast=p), {"lambda": p.grd_lambda, "gate_mode": p.gate_mode})


def _ph3(x: MethodInputs) -> Built:
    if x.pruned is not None:
        heads = list(x.pruned)
        return Built(_method(Prune(x.geometry, heads)), {"k": len(heads), "pruned": [str(h) for h in heads]})
    tuned = x.tuned.ph3
    if tuned is None:
        raise ValueError("PH3 needs its k: run `juice tune --methods ph3` on validation data first")
    heads = [Head.parse(h) for h in tuned.pruned]
    return Built(_method(Prune(x.geometry, heads)), {"k": tuned.k, "pruned": list(tuned.pruned)})


def _steering(name: str, kind: str) -> Callable[[MethodInputs], Built]:
    preset = PRESETS[kind]

    def build(x: MethodInputs) -> Built:
        if x.coefficients is not None:   # explicit per-head coefficients (a request's `heads`)
            return Built(_method(PerHead(kind, x.geometry, x.coefficients)),
                         {"coefficients": {str(h): float(c) for h, c in sorted(x.coefficients.items())}})
        if x.selection is None:
            raise ValueError(f"{name} needs a heads file")
        bp, bm, warning = chosen_betas(name, x.tuned, x.beta_plus, x.beta_minus)
        source = ("given" if x.beta_plus is not None or x.beta_minus is not None
                  else "default" if warning else "tuned")
        return Built(_method(preset(x.model, x.selection, bp, bm)),
                     {"beta_plus": bp, "beta_minus": bm, "source": source}, warning)
    return build


_BUILT_IN: tuple[MethodSpec, ...] = (
    MethodSpec("original", "Original", _original, protocol=True, steerer=True, steering="none",
               summary="the unmodified model", tables=("table1", "table2")),
    MethodSpec("prompt", "Prompt", _prompt, per_instruction=True,
               summary="an instruction to follow the context or memory before the prompt (App. D.1)",
               tables=("table1", "table2")),
    MethodSpec("cad", "CAD", _cad, summary="context-aware decoding, alpha 1 (Shi et al. 2024)", tables=("table2",)),
    MethodSpec("adacad", "AdaCAD", _adacad, summary="CAD with alpha = the branches' JSD in bits (Wang et al. 2025)",
               tables=("table2",)),
    MethodSpec("ckplug", "CK-PLUG", _ckplug, aliases=("ck-plug",),
               summary="adaptive CK-PLUG: parametric and context logits blended by entropy (Bi et al. 2026)"),
    MethodSpec("cocoa", "CoCoA", _cocoa,
               summary="CoCoA as TriState-Bench runs it: greedily, CAD at alpha 0.5 (Jiang et al. 2026)"),
    MethodSpec("coiecd", "COIECD", _coiecd,
               summary="CAD on the tokens the context makes likely, the prior elsewhere (Yuan et al. 2024)"),
    MethodSpec("grd", "GRD", _grd,
               summary="gated reversal decoding: trust the prior or the context from the first conflict on (Jiang et al. 2026)"),
    MethodSpec("ph3", "PH3", _ph3, aliases=("prune",), protocol=True, heads=True, tuned="k", tune=True,
               steering="scale", request_heads="zero", summary="zero k heads, k tuned on validation (Jin et al. 2024)",
               tables=("table1", "table2")),
    MethodSpec("june", "JuNE", _steering("june", "scale"), protocol=True, heads=True, tuned="betas",
               tune=True, steerer=True, steering="scale", request_heads="coefficients",
               summary="scale the heads' live outputs, one run (Alg. 4)", tables=("table1", "table2")),
    MethodSpec("juice", "JuICE", _steering("juice", "add"), protocol=True, heads=True, tuned="betas",
               tune=True, steerer=True, steering="add", request_heads="coefficients",
               summary="add the clean run's head outputs, two runs (Alg. 1)", tables=("table1", "table2")),
)


PLUGIN_GROUP = "juice.methods"
"""The entry-point group of methods implemented above the registry: each entry names a function
of no arguments that calls :func:`register` (juice's own: `auto = "juice.when_to_steer.auto:register"`)."""


def plugin_entry_points(group: str = PLUGIN_GROUP) -> list[EntryPoint]:
    """The entry points of `group` that installed packages declare, and, where juice runs from a
    checkout, those its `pyproject.toml` declares (`[project.entry-points."juice.methods"]`) that
    no installed package does: so juice's own plugins (`auto`) register in a checkout that is not
    installed (`PYTHONPATH=src`, as the GPU check runs it) or was installed before they existed."""
    points = list(entry_points(group=group))
    project = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if project.is_file():
        import tomllib

        meta = tomllib.loads(project.read_text(encoding="utf-8")).get("project", {})
        if meta.get("name") == "juice":
            have = {p.name for p in points}
            points += [EntryPoint(name, value, group) for name, value in meta.get("entry-points", {}).get(group, {}).items()
                       if name not in have]
    return points


class Registry(MutableMapping[str, MethodSpec]):
    """name -> :class:`MethodSpec`, in table order: juice's built-in methods, then those the
    `juice.methods` entry points register (:data:`PLUGIN_GROUP`, :func:`plugin_entry_points`),
    loaded the first time the registry is listed or asked for a name it lacks (so importing juice
    loads no plugin, and a built-in method is found without loading any); another thread listing
    it meanwhile waits for them. A plugin that fails to register is warned about
    (`RuntimeWarning`), kept in `failures` and named when its method is asked for; the others load.

    Setting an entry (`registry[name] = spec`, as a test's monkeypatch does) checks only that the
    name is the spec's; :func:`register` is the checked way in.
    """

    def __init__(self, specs: Sequence[MethodSpec], group: str = PLUGIN_GROUP) -> None:
        self._specs: dict[str, MethodSpec] = {s.name: s for s in specs}
        self._group = group
        self._plugins = "unloaded"   # -> "loading" -> "loaded"
        self._lock = threading.RLock()
        self.failures: list[str] = []   # one line per plugin that failed to register

    def _load_plugins(self) -> None:
        """Load the plugins once. Another thread that lists the registry meanwhile waits for them;
        the loading thread itself (a plugin's import reading the registry) goes on without."""
        if self._plugins == "loaded":
            return
        with self._lock:
            if self._plugins != "unloaded":   # loaded while this thread waited, or this thread is loading
                return
            self._plugins = "loading"
            try:
                for point in plugin_entry_points(self._group):
                    try:
                        point.load()()
                    except Exception as exc:   # the other plugins still load; said now and with an unknown name
                        failure = (f"the method plugin {point.name} ({point.value}) failed to register: "
                                   f"{type(exc).__name__}: {exc}")
                        self.failures.append(failure)
                        warnings.warn(failure, RuntimeWarning, stacklevel=2)
            finally:
                self._plugins = "loaded"

    def register(self, spec: MethodSpec) -> None:
        """Add `spec` after the methods already there (see :func:`register`)."""
        same = self._specs.get(spec.name)
        if same is spec:
            return
        taken = {spec.name, *spec.aliases} & {n for s in self._specs.values() for n in (s.name, *s.aliases)}
        if taken:
            raise ValueError(f"method {spec.name}: the name {sorted(taken)[0]!r} is taken")
        self._specs[spec.name] = spec

    def find(self, name: str) -> MethodSpec | None:
        """The spec whose name or alias is `name` (any case, spaces around ignored), or None;
        the plugins are loaded only when no method registered so far has it."""
        key = str(name).strip().lower()

        def match() -> MethodSpec | None:
            return next((s for s in tuple(self._specs.values())   # a copy: another thread may be registering
                         if key == s.name or key in s.aliases), None)

        spec = match()
        if spec is None:
            self._load_plugins()
            spec = match()
        return spec

    def __getitem__(self, name: str) -> MethodSpec:
        if name not in self._specs:
            self._load_plugins()
        return self._specs[name]

    def __setitem__(self, name: str, spec: MethodSpec) -> None:
        if name != spec.name:
            raise ValueError(f"registry key {name!r} is not the method's name {spec.name!r}")
        self._specs[name] = spec

    def __delitem__(self, name: str) -> None:
        del self._specs[name]

    def __iter__(self) -> Iterator[str]:
        self._load_plugins()
        return iter(tuple(self._specs))

    def values(self):
        """The specs, in table order (read straight from the table, not name by name)."""
        self._load_plugins()
        return dict(self._specs).values()

    def items(self):
        """(name, spec), in table order (read straight from the table, not name by name)."""
        self._load_plugins()
        return dict(self._specs).items()

    def __len__(self) -> int:
        self._load_plugins()
        return len(self._specs)

    def __contains__(self, name: object) -> bool:
        if name not in self._specs:
            self._load_plugins()
        return name in self._specs

    def __repr__(self) -> str:
        return f"Registry({', '.join(self._specs)})"


REGISTRY: Registry = Registry(_BUILT_IN)
"""name -> spec, in table order (:class:`Registry`): the built-in methods, then the plugins'
(`auto`)."""


def register(spec: MethodSpec) -> None:
    """Add a method to :data:`REGISTRY`, after those there: what a function in the `juice.methods`
    entry-point group (:data:`PLUGIN_GROUP`) calls. Registering the same spec again does nothing.

    Raises:
        ValueError: its name or an alias is another method's name or alias.
    """
    REGISTRY.register(spec)


STEERINGS: tuple[str, ...] = tuple(s.name for s in _BUILT_IN if s.tuned == "betas")
"""The head steerings, the built-in methods with tuned betas (a heads file's `tuned[name] =
{"beta_plus", "beta_minus", ...}`), in table order (JuNE, JuICE)."""

TUNED_STEERINGS: tuple[str, ...] = tuple(reversed(STEERINGS))
""":data:`STEERINGS` in the order a server's default and the tuners prefer them (JuICE first)."""


def names(**where: bool | str) -> tuple[str, ...]:
    """The registry's names whose spec has every given flag or value, e.g. `names(steerer=True)`,
    `names(tuned="policy")`."""
    def has(spec: MethodSpec, key: str, want: bool | str) -> bool:
        value = getattr(spec, key)
        return bool(value) == want if isinstance(want, bool) else value == want
    return tuple(n for n, s in REGISTRY.items() if all(has(s, k, v) for k, v in where.items()))


def table_methods(table: str) -> tuple[MethodSpec, ...]:
    """The methods that are rows of `table` (:data:`TABLES`), in registry order (the table's row
    order), read from the registry when called, so an entry added later is a row too.

    Raises:
        ValueError: `table` is not one of :data:`TABLES`.
    """
    if table not in TABLES:
        raise ValueError(f"no table {table!r} ({', '.join(TABLES)})")
    return tuple(s for s in REGISTRY.values() if table in s.tables)


def protocol_names() -> tuple[str, ...]:
    """The request protocol's method names (:mod:`juice.steering_request`), in table order."""
    return tuple(s.name for s in REGISTRY.values() if s.protocol)


UNSTEERED = "original"
"""The method that steers nothing: a request's answer where no steering applies."""

FOCUS = "juice"
"""The method the tables compare with every other row (JuICE, the paper's)."""

VARIANTS: dict[str, str] = {"l": "-l", "s": "-s", "l-knockout": "-l (knock-out)", "mem": "-mem", "ctx": "-ctx",
                            "post-norm": " (post-norm)"}
"""A row's variant -> what its title adds to the method's: PH3's development sets ("l": PH3-l, on the
large one; "s": PH3-s, on D; "l-knockout": PH3-l scored by knock-out), a direction or instruction
("mem", "ctx": JuICE-ctx, Prompt-mem) and the steering site ("post-norm": JuICE (post-norm))."""


@dataclass(frozen=True)
class Row:
    """A table row's identity: a registry method, its variant (:data:`VARIANTS`) and the share of
    its tuned betas it steers with. Results, tables and stages carry its :attr:`key`; its
    :attr:`title` is what tables, pages and records show (rendered there: :func:`row_title`).

    Attributes:
        share: "" (the tuned betas) or "/N" (1/N of them: the when-to-steer study's "juice/2-ctx",
            one of auto's candidates, :attr:`juice.when_to_steer.auto.Candidate.label`).

    Raises:
        ValueError: an unknown variant; a share that is not "/N".
    """

    method: str
    variant: str = ""
    share: str = ""

    def __post_init__(self) -> None:
        if self.variant and self.variant not in VARIANTS:
            raise ValueError(f"row {self.method}: no variant {self.variant!r} ({', '.join(VARIANTS)})")
        if self.share and not _SHARE.fullmatch(self.share):
            raise ValueError(f"row {self.method}: a share is '/N' (a fraction of the tuned betas), got {self.share!r}")

    @property
    def key(self) -> str:
        """"ph3-l", "juice-ctx", "juice/2-ctx", "original": the method's name, its share, its variant."""
        return f"{self.method}{self.share}-{self.variant}" if self.variant else self.method + self.share

    @property
    def title(self) -> str:
        """"PH3-l", "JuICE-ctx", "JuICE/2-ctx", "Original": the method's title, its share, then its
        variant's suffix."""
        return REGISTRY[self.method].title + self.share + VARIANTS.get(self.variant, "")


_SHARE = re.compile(r"/[0-9]+(?:\.[0-9]+)?")
"""A row's share of its method's tuned betas: "/2"."""


_ROWS: list[Any] = [None, {}]   # (the registry's names and titles it was built from, the table)


def _rows() -> dict[str, Row]:
    """Every row key and title of the registry's methods -> its row (each method with each variant),
    rebuilt only when the registry's names or titles change."""
    stamp = tuple((name, spec.title) for name, spec in REGISTRY.items())
    if _ROWS[0] != stamp:
        table: dict[str, Row] = {}
        for name, title in stamp:
            for variant, suffix in (("", ""), *VARIANTS.items()):
                row = Row(name, variant)
                table[row.key] = table[title + suffix] = row
        _ROWS[:] = [stamp, table]
    return _ROWS[1]


def row_of(label: str) -> Row | None:
    """The row a key ("ph3-l", "juice/2-ctx") or a title ("PH3-l", "JuICE/2-ctx") names, or None (a
    label that is no row of the registry: "Question-only", a tuning setting's "juice:2:-1")."""
    row = _rows().get(label)
    if row is None and "/" in label:   # a share of the tuned betas: "juice/2-ctx" is "juice-ctx" at 1/2
        share = _SHARE.search(label)
        base = None if share is None else _rows().get(label[:share.start()] + label[share.end():])
        row = None if base is None else replace(base, share=share.group())
    return row


def row_key(label: str) -> str:
    """A row's key from its key or title (where a saved file or a user names it: a results file,
    a stage's state, a sweep file, a when-to-steer study's outcomes), a paired difference "A - B"
    of two (both sides keyed) or any other label (unchanged)."""
    if " - " in label:
        return " - ".join(row_key(part) for part in label.split(" - "))
    row = row_of(label)
    return label if row is None else row.key


def row_title(label: str) -> str:
    """What a table, page or record shows for a row key (:attr:`Row.title`), a paired difference
    "a - b" of two (both sides titled) or any other label (unchanged)."""
    if " - " in label:
        return " - ".join(row_title(part) for part in label.split(" - "))
    row = row_of(label)
    return label if row is None else row.title


def lookup(name: str, choices: Sequence[str] | None = None) -> MethodSpec:
    """The spec named `name` (any case, aliases included).

    Args:
        choices: the names allowed here (default: all).

    Raises:
        ValueError: an unknown name (the message lists `choices`).
    """
    spec = REGISTRY.find(name)
    if spec is not None and (choices is None or spec.name in choices):
        return spec
    allowed = tuple(choices) if choices is not None else tuple(REGISTRY)
    failed = f" ({'; '.join(REGISTRY.failures)})" if REGISTRY.failures else ""
    raise ValueError(f"unknown method {name!r}; choose from {', '.join(allowed)}{failed}")


def by_protocol(name: str) -> MethodSpec:
    """The spec a request's `method` names (:func:`protocol_names`; any case, aliases included).

    Raises:
        ValueError: no method a request may ask for has that name (the message lists them).
    """
    spec = REGISTRY.find(name)
    if spec is not None and spec.protocol:   # one lookup; the names are listed only for the error
        return spec
    return lookup(name, protocol_names())


def coefficients_method(kind: str) -> MethodSpec:
    """The method a request names to carry a steering of `kind` as per-head coefficients
    (`request_heads="coefficients"`: JuNE for "scale", JuICE for "add"): how a steering
    :class:`~juice.steering.Steering` is sent to vLLM's plugin (:mod:`juice.vllm.engine`; an
    unsteered one is sent as :data:`UNSTEERED`).

    Raises:
        ValueError: no such method ("none", or an unknown kind).
    """
    for spec in REGISTRY.values():
        if spec.steering == kind and spec.request_heads == "coefficients":
            return spec
    raise ValueError(f"no method carries a steering of kind {kind!r} as per-head coefficients")


def recipe_of(name: str, model: LoadedModel | HeadGeometry | None = None, selection: HeadSelection | None = None,
              beta_plus: float | None = None, beta_minus: float | None = None, instruction: str | None = None
              ) -> Method:
    """Method `name`'s recipe (:func:`build` without warnings) from a model, heads, betas and (the
    Prompt baseline's) instruction: how auto's candidates are built
    (:func:`juice.when_to_steer.auto.candidate_recipe`), so that a candidate decodes as its method
    does everywhere.

    Raises:
        As :func:`build`.
    """
    return build(name, MethodInputs(model, selection, beta_plus=beta_plus, beta_minus=beta_minus,
                                    instruction=instruction), warn=False).method


def check(name: str, tuned: TunedSettings | Mapping[str, Any] | None, *, has_heads: bool, where: str = ""
          ) -> MethodSpec:
    """What building `name` would refuse, checked without a model (so a command refuses bad input
    before loading one).

    Args:
        tuned: the heads file's `tuned` settings, None without a file.
        where: the heads file named in messages (e.g. "in the contextual heads file").

    Raises:
        ValueError: an unknown name; a heads method without heads; PH3 without its tuned k; auto
            without a tuned policy.
    """
    spec = lookup(name)
    if spec.heads and not has_heads:
        raise ValueError(f"{spec.name} needs a heads file")
    tuned = TunedSettings.of(tuned)
    if spec.tuned == "k" and tuned.ph3 is None:
        raise ValueError(f"PH3 needs its k{where}: run `juice tune --methods ph3` on validation data first")
    if spec.tuned == "policy" and tuned.auto is None:
        raise ValueError(f"auto needs a policy tuned on validation items{where}: run `juice tune --methods auto` "
                         "with validation data (NQ-Swap, ParaConflict) first")
    return spec


def build(name: str | MethodSpec, inputs: MethodInputs, *, warn: bool = True) -> Built:
    """Method `name` (a registry name, or an entry already looked up: no second lookup) built
    from `inputs`; with `warn`, an untuned-betas warning is also raised as an
    :class:`~juice.steering.UntunedBetasWarning`.

    Raises:
        ValueError: an unknown name, or what the method's build refuses (see :func:`check`).
        IndexError: a head outside the model.
    """
    built = (name if isinstance(name, MethodSpec) else lookup(name)).build(inputs)
    if warn and built.warning:
        warnings.warn(built.warning, UntunedBetasWarning, stacklevel=3)
    return built


__all__ = ["Built", "FOCUS", "MethodInputs", "MethodSpec", "PLUGIN_GROUP", "REGISTRY", "Registry", "Row", "SHORT", "STEERINGS",
           "TABLES", "TUNED_STEERINGS", "UNSTEERED", "VARIANTS", "build", "by_protocol", "check", "coefficients_method", "lookup", "names", "protocol_names",
           "recipe_of", "plugin_entry_points", "register", "row_key", "row_of", "row_title", "table_methods"]
