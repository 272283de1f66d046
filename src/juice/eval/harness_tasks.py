"""juice's evaluations as lm-evaluation-harness tasks (`juice tasks --out DIR`; issue 35, part 3).

`lm_eval --include_path DIR --tasks juice` then runs them on any model type the harness has
(`hf`, `vllm`, `local-completions` against `juice serve` with an alias naming the steering).
The harness has no NQ-Swap task, and its MemoTrap (`inverse_scaling_memo_trap`) is scored as a
two-way likelihood comparison, not as the paper scores it. These tasks score as juice does, by
importing juice's own metrics (`utils.py` calls :mod:`juice.eval.verdicts`), so juice must be
installed where the harness runs:

- one task per contextual dataset (:data:`juice.data.contextual.DATASETS`), scored by its metric's
  rule with its budget (:data:`juice.data.metrics.METRICS`), greedy: `exact_match` is the context
  answer, `follows_memory` the memorised one. `juice_nqswap`: NQ-Swap (Longpre et al. 2021),
  juice's prompt (:func:`juice.data.nqswap.context_prompt`), 20 new tokens, juice's normalized
  substring match. `juice_memotrap_<subtask>` (tag `juice_memotrap`; datasets that share a
  metric are named and tagged by it): MemoTrap's four subtasks, 10 new tokens, the continuation's
  words against the output's first words (:func:`~juice.data.metrics.memotrap_match`,
  docs/protocol.md; `follows_memory`: the memorised continuation's).
- `juice_contexts_<source>_<type>` (group `juice_contexts`): the context-type evaluation
  (:mod:`juice.data.context_types`): NQ-Swap's and the built-in ParaConflict domains' questions
  with a gold, conflicting, irrelevant and no context; metrics `use_relevant`, `trust_memory`
  and `follows_context` (:func:`~juice.eval.verdicts.context_verdicts`). ParaConflict items
  generate 10 tokens and are scored on their first 5 words (juice's own run stops a row once
  those are final: the same verdicts).

Every task is `generate_until` with no stop string (`until: []`: a row ends at EOS or at the
token budget, as juice's evaluation does) and `temperature: 0`. The documents are JSONL files
written beside the YAMLs from the local data (`--data-root` / `$JUICE_DATA`); nothing is
downloaded. Where juice's own evaluation drops prompts (`juice reproduce`'s token limit), these
tasks keep every row: pass `--limit` to the harness for a quick run.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from juice.data.context_types import CONTEXT_TYPES, ContextItem
from juice.data.contextual import DATASETS
from juice.data.metrics import new_tokens


UTILS = '''"""Written by `juice tasks`: the harness's scores are juice's own metrics."""

from juice.data.context_types import ContextItem
from juice.data.metrics import METRICS
from juice.eval.verdicts import context_verdicts


def contextual(doc, results):
    match = METRICS[doc["metric"]].match   # the contextual table's rule for the document's metric
    return {"exact_match": float(match(results[0], doc["answers"])),
            "follows_memory": float(match(results[0], doc["memory_answers"]))}


def contexts(doc, results):
    item = ContextItem(**{k: tuple(v) if isinstance(v, list) else v for k, v in doc["item"].items()})
    verdicts = context_verdicts(item, results[0])
    return {k: float(v) for k, v in verdicts.items() if v is not None}   # no follows_context without a passage
'''


def _yaml(task: str, data: Path, process: str, new_tokens: int, metrics: Sequence[str], group: str | None = None) -> str:
    lines = [f"task: {task}"]
    if group:
        lines += ["tag:", f"  - {group}"]
    lines += ["dataset_path: json", "dataset_kwargs:", "  data_files:", f"    test: {json.dumps(str(data))}",
              "test_split: test", "output_type: generate_until", 'doc_to_text: "{{prompt}}"',
              'doc_to_target: "{{target}}"', f"process_results: !function utils.{process}",
              "generation_kwargs:", "  until: []", f"  max_gen_toks: {new_tokens}", "  do_sample: false",
              "  temperature: 0", "metric_list:"]
    for m in metrics:
        lines += [f"  - metric: {m}", "    aggregation: mean", "    higher_is_better: true"]
    lines += ["metadata:", "  version: 1.0"]
    return "\n".join(lines) + "\n"


def _write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, path)


def context_doc(item: ContextItem) -> dict:
    """A context-type item as a harness document: its prompt, a target (the use-relevant answer),
    and the item itself (for the verdicts)."""
    return {"prompt": item.prompt, "target": item.target("use_relevant")[0], "item": asdict(item)}


def write_tasks(out: str | Path, data_root: str | Path | None = None, *, seed: int = 0) -> list[str]:
    """Write the task YAMLs, their JSONL documents and `utils.py` into `out` (module docstring).

    Args:
        data_root: a folder with the contextual datasets' folders (any of
            :data:`juice.data.contextual.DATASETS`; default `$JUICE_DATA`); the built-in
            ParaConflict context tasks need none.
        seed: the irrelevant passages' pairing (a dataset entry's `context_items`).

    Returns:
        the task names written.

    Raises:
        FileNotFoundError: `data_root` given but missing.
        ValueError: a malformed data row (the loaders' one-line errors).
    """
    from juice.data.context_types import paraconflict_context_items
    from juice.data.paraconflict import DOMAINS, build_domain

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    root = data_root or os.environ.get("JUICE_DATA")
    root = Path(root) if root else None
    if root is not None and not root.is_dir():
        raise FileNotFoundError(f"no such data folder: {root}")
    (out / "utils.py").write_text(UTILS, encoding="utf-8")
    names: list[str] = []

    def task(name: str, rows: list[dict], process: str, new_tokens: int, metrics: Sequence[str],
             group: str | None = None) -> None:
        _write_jsonl(out / f"{name}.jsonl", rows)
        (out / f"{name}.yaml").write_text(_yaml(name, (out / f"{name}.jsonl").resolve(), process, new_tokens,
                                                metrics, group), encoding="utf-8")
        names.append(name)

    contexts: dict[str, list[ContextItem]] = {}
    sharing = Counter(d.metric for d in DATASETS.values())
    for name, dataset in DATASETS.items():   # the contextual datasets, one table (juice.data.contextual)
        folder = None if root is None else root / dataset.folder
        if folder is None or not folder.is_dir():
            continue
        try:
            examples = dataset.load(folder)
        except FileNotFoundError:   # a folder without this dataset's file
            continue
        rows = [{"id": ex.uid, "prompt": ex.prompt, "target": ex.context_answers[0],
                 "answers": list(ex.context_answers), "memory_answers": list(ex.parametric_answers),
                 "metric": ex.metric} for ex in examples]
        shared = sharing[dataset.metric] > 1   # MemoTrap's subtasks: juice_memotrap_<subtask>, tagged juice_memotrap
        tag = f"juice_{dataset.metric}" if shared else None
        task(f"{tag}_{name}" if shared else f"juice_{name}", rows, "contextual", new_tokens(dataset.metric),
             ["exact_match", "follows_memory"], tag)
    for name, dataset in DATASETS.items():   # a dataset's questions under every context type, where it has them
        folder = None if root is None else root / dataset.folder
        if dataset.context_items is None or folder is None or not folder.is_dir():
            continue
        try:
            contexts[name] = dataset.context_items(folder, seed)
        except FileNotFoundError:
            continue
    contexts["paraconflict"] = paraconflict_context_items(
        [ex for d in DOMAINS for ex in build_domain(d)], seed).items
    for source, items in contexts.items():
        for context_type in CONTEXT_TYPES:
            mine = [context_doc(i) for i in items if i.context_type == context_type]
            metrics = ["use_relevant", "trust_memory"] + (["follows_context"] if context_type != "none" else [])
            task(f"juice_contexts_{source}_{context_type}", mine, "contexts",
                 new_tokens(items[0].metric), metrics, "juice_contexts")
    return names


__all__ = ["context_doc", "write_tasks"]
