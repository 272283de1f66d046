"""The parametric direction's data per domain (docs/protocol.md, "Parametric direction: splits
and filtering"): each domain's development pool and test split, and the pool *filtered* for the
loaded model (its clean prompts decoded greedily until enough items are known), from which D (the
head domain only), the validation split and PH3-l's development set (head domain only) come,
each item with the answer alias the model prefers (:mod:`juice.aliases`).

With the authors' files (`--data`), those are the authors' splits: D from the head domain's
head-finding file, each domain's validation split from its own `filtered_validation.json`
(PH3-l's set from the head domain's, after its validation items), the test split from
`unfiltered_test.json`; each re-filtered for the loaded model unless `--no-filter`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from juice.aliases import prefer_aliases
from juice.data.paraconflict import DOMAINS, build_domain
from juice.data.records import ConflictExample
from juice.data.splits import DomainPool, Splits, load_paper_domains, split_test
from juice.data.metrics import is_correct
from juice.engine.backend import Engine
from juice.eval.runner import evaluate
from juice.io import settings_key
from juice.models import LoadedModel
from juice.pipeline.run import ReproduceConfig, StageRun
from juice.steering import Steering
from juice.progress import OnProgress
HEAD_DOMAIN = "world_capital"
"""The domain whose D gives the heads (the transfer setting) and whose pool gives PH3-l's items."""
FILTER_CHUNK = 24
"""Pool items decoded at a time while filtering (decoding stops once enough are known)."""


def domain_sources(cfg: ReproduceConfig) -> tuple[dict[str, DomainPool], dict[str, str]]:
    """Every domain's development pool and test split (cut to `cfg.test_limit`), and its title.

    Built-in domains: half of the items (seeded) are the test split, the rest the pool in seeded
    order. With `cfg.data`: the paper's layout (:func:`juice.data.splits.load_paper_domains`).
    """
    if cfg.data is not None:
        sources = load_paper_domains(cfg.data, cfg.head_set_size)
        titles = {d: DOMAINS[d].title if d in DOMAINS else d.replace("_", " ").title() for d in sources}
    else:
        sources = {}
        for domain in cfg.domains:
            pool, test = split_test(build_domain(domain, cfg.seed), cfg.seed)
            sources[domain] = DomainPool(tuple(pool), tuple(test))
        titles = {d: DOMAINS[d].title for d in sources}
    limit = cfg.test_limit("parametric")
    return {d: replace(s, test=s.test if limit is None else s.test[:limit]) for d, s in sources.items()}, titles


def clean_outputs(lm: LoadedModel, examples: Sequence[ConflictExample], max_rows: int | str,
                  on_progress: OnProgress | None = None, engine: Engine | None = None) -> list[str]:
    """The unmodified model's greedy continuation (10 new tokens) of each clean prompt, decoded
    by `engine` (None: juice's own)."""
    results = evaluate(lm, examples, {"Original": Steering()}, ("clean",), max_rows=max_rows, on_progress=on_progress,
                       engine=engine)
    return [r.output for r in results]


def filter_domain(
    run: StageRun, key: str, domain: str, source: DomainPool, need: int | None, part: str = "development pool",
) -> tuple[list[ConflictExample], list[ConflictExample], dict[str, int]]:
    """The pool's items the model knows, in pool order, until `need` are found (None: all), and
    the test split; both with each item's preferred alias first.

    Known = the greedy clean-prompt output contains an accepted answer (exact match). Pool
    items are decoded in chunks of `FILTER_CHUNK` only until `need` are known. Without
    `cfg.filter`, every pool item counts as known, and the first `need` (the items D, validation
    and PH3-l are drawn from) are decoded for their preferred alias, which for an item the model
    does not know is the alias whose first token is most probable. `part` names the pool in the
    progress lines (e.g. "head-finding file").

    Returns:
        (known pool items, test items, counts: pool, decoded, known).
    """
    lm, cfg, state, progress, engine = run.lm, run.cfg, run.state, run.progress, run.engine
    run.ran("data and filter")
    stage = f"filter_{domain}_{key}"   # one file per model, data and seed: several can share a folder
    saved = state.load(stage, key)
    if saved is None:
        test = list(source.test)
        advance = progress(f"{domain}: clean prompts of the test split (answer aliases)", len(test))
        saved = {"test_outputs": clean_outputs(lm, test, cfg.max_rows, advance, engine) if test else [], "pool_outputs": []}
        if cfg.filter:
            advance = progress(f"{domain}: filter the {part} (clean prompts)", len(source.pool))
            outputs: list[str] = []
            known = 0
            while len(outputs) < len(source.pool) and (need is None or known < need):
                chunk = list(source.pool[len(outputs): len(outputs) + FILTER_CHUNK])
                new = clean_outputs(lm, chunk, cfg.max_rows, advance, engine)
                known += sum(is_correct(o, ex.answers) for o, ex in zip(new, chunk))
                outputs += new
            saved["pool_outputs"] = outputs
        else:   # no filter: the items used (the first `need`) still get the preferred alias
            used = list(source.pool if need is None else source.pool[:need])
            advance = progress(f"{domain}: clean prompts of the {part}'s items (answer aliases)", len(used))
            outputs = clean_outputs(lm, used, cfg.max_rows, advance, engine) if used else []
            used = prefer_aliases(lm, used, outputs, max_rows=cfg.max_rows, engine=engine) if used else []
            saved["pool_outputs"], saved["pool_answers"] = outputs, [list(ex.answers) for ex in used]
        test_items = prefer_aliases(lm, test, saved["test_outputs"], max_rows=cfg.max_rows, engine=engine) if test else []
        saved["test_answers"] = [list(ex.answers) for ex in test_items]
        state.save(stage, key, saved)
    test_items = [replace(ex, answers=tuple(a)) for ex, a in zip(source.test, saved["test_answers"])]
    if not cfg.filter:
        used = [replace(ex, answers=tuple(a)) for ex, a in zip(source.pool, saved["pool_answers"])]
        items = used + list(source.pool[len(used):])
        return items, test_items, {"pool": len(source.pool), "decoded": len(used), "known": len(items)}
    outputs = saved["pool_outputs"]
    decoded = list(source.pool[: len(outputs)])
    known = [(ex, o) for ex, o in zip(decoded, outputs) if is_correct(o, ex.answers)]
    # a known item's alias is found in its output: no probabilities needed
    known_items = prefer_aliases(lm, [ex for ex, _ in known], [o for _, o in known])
    return known_items, test_items, {"pool": len(source.pool), "decoded": len(outputs), "known": len(known_items)}


def prepare_domains(
    run: StageRun, base: dict,
) -> tuple[dict[str, Splits], dict[str, str], str, dict[str, dict[str, int]]]:
    """Stage 1 of the module docstring for every domain.

    With the authors' files (a `head_pool`), D is the head domain's known head-finding items;
    where the model knows fewer than |D| of them, the first known items of that domain's
    validation file fill D (and leave its validation split), and a note says so.

    Returns:
        (domain -> splits with D (head domain only), validation, PH3-l development set (head
        domain only) and test; domain -> title; the head domain; domain -> filter counts).

    Raises:
        ValueError: the head domain has fewer known items than |D| + 1 (|D| where no validation
            item is asked for, as `juice identify` asks); the message names the options.
    """
    cfg = run.cfg
    sources, titles = domain_sources(cfg)
    head_domain = HEAD_DOMAIN if HEAD_DOMAIN in sources else next(iter(sources))
    splits, counts = {}, {}
    for domain, source in sources.items():
        is_head = domain == head_domain
        head_known: list[ConflictExample] = []
        from_pool = cfg.head_set_size if is_head else 0   # D's items that come from the pool
        if is_head and source.head_pool:
            head_key = settings_key({**base, "stage": "filter", "domain": domain, "part": "head_set",
                                     "filter": cfg.filter, "pool": [ex.to_json() for ex in source.head_pool]})
            head_known, _, head_counts = filter_domain(run, head_key, domain, DomainPool(source.head_pool, ()), None,
                                                       part="head-finding file")
            head_known = head_known[: cfg.head_set_size]
            from_pool = cfg.head_set_size - len(head_known)
            if from_pool:
                run.notes.append(f"{titles[domain]}: the model knows {len(head_known)} of the head-finding file's "
                                 f"{len(source.head_pool)} items; D takes {from_pool} more from the validation file")
        parts = [cfg.validation_size, from_pool]
        if is_head:
            parts += [cfg.ph3_dev_size if cfg.baselines else 0]
        need = None if any(p is None for p in parts) else sum(parts)
        key = settings_key({**base, "stage": "filter", "domain": domain, "filter": cfg.filter, "need": need,
                            "pool": [ex.to_json() for ex in source.pool], "test": [ex.to_json() for ex in source.test]})
        known, test, counts[domain] = filter_domain(run, key, domain, source, need)
        if is_head and source.head_pool:
            counts[domain] |= {f"head_{k}": v for k, v in head_counts.items()}
        head_set: list[ConflictExample] = []
        if is_head:
            extra = int(cfg.validation_size != 0)   # one validation item too, unless none is asked for (identify)
            n_known = len(head_known) + len(known)
            if n_known < cfg.head_set_size + extra:
                where = "head-finding and validation items" if source.head_pool else "development items"
                raise ValueError(
                    f"{titles[domain]}: only {n_known} {where} are answered correctly on the clean prompt; need at "
                    f"least {cfg.head_set_size + extra} for a head identification set of {cfg.head_set_size}"
                    f"{' and validation' if extra else ''}. Use a smaller D (--head-set-size "
                    f"{max(1, n_known - extra)}), your own rows (--data FILE) or another domain "
                    "(juice identify --domain)")
            head_set, known = head_known + known[:from_pool], known[from_pool:]
        if cfg.validation_size is not None:
            n_val = cfg.validation_size
        elif is_head and cfg.baselines:
            n_val = (len(known) + 1) // 2   # all items (--full): half for validation, the rest for PH3-l
        else:
            n_val = len(known)
        validation, rest = known[:n_val], known[n_val:]
        ph3_dev = (rest if cfg.ph3_dev_size is None else rest[: cfg.ph3_dev_size]) if is_head and cfg.baselines else []
        splits[domain] = Splits(tuple(head_set), tuple(validation), tuple(test), tuple(ph3_dev))
    return splits, titles, head_domain, counts
