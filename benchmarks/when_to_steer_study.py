"""The when-to-steer numbers of docs/when-to-steer.md: `juice.context_study.run_study` on NQ-Swap
or the six built-in ParaConflict domains, with the contextual heads and NQ-Swap's tuned betas of
a `juice reproduce --direction contextual` run (Table 2, the paper's protocol).

    juice reproduce --direction contextual --out juice-output          # heads and betas (Table 2)
    python benchmarks/when_to_steer_study.py nqswap --reproduced juice-output --size published
    python benchmarks/when_to_steer_study.py paraconflict --reproduced juice-output --size published

The same study runs inside `juice reproduce --direction contextual --contexts nqswap,paraconflict`
(`--full`: the published size) after Table 2; this script studies an existing reproduction.

Sizes (distinct questions per source, validation / test): "default" 40 / 40 (NQ-Swap) and 8 / 8
per domain (ParaConflict); "published" 300 / 250 (NQ-Swap) and 55 / 50 per domain (330 / 300 over
the six). NQ-Swap keeps prompts of at most 256 tokens. Resumable: decoding is cached per chunk
in `<out>/cache`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def heads_with_table2_betas(reproduced: Path, out: Path) -> Path:
    """`heads_contextual.json` of a contextual reproduction with NQ-Swap's tuned JuICE and JuNE
    betas (its `results_contextual.json`, `choices.nqswap.betas`) written into `tuned`
    (:func:`juice.experiments.table2.table2_heads`)."""
    from juice.experiments.table2 import table2_heads

    heads = json.loads((reproduced / "heads_contextual.json").read_text(encoding="utf-8"))
    betas = json.loads((reproduced / "results_contextual.json").read_text(encoding="utf-8"))["choices"]["nqswap"]["betas"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table2_heads(heads, betas, f"{reproduced}/results_contextual.json"), indent=1),
                   encoding="utf-8")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from juice.pipeline.run import STUDY_SIZES

    parser.add_argument("dataset", choices=sorted(STUDY_SIZES))
    parser.add_argument("--reproduced", type=Path, required=True, help="a `juice reproduce --direction contextual` output")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="holds nqswap/ (NQ-Swap only)")
    parser.add_argument("--size", choices=["default", "published"], default="default")
    parser.add_argument("--out", type=Path, default=None, help="default: when-to-steer-<dataset>-<size>")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    import juice
    from juice.context_study import run_study
    from juice.experiments.table2 import STUDY_MAX_PROMPT_TOKENS
    from juice.when_to_steer import prompt_fits

    out = args.out or Path(f"when-to-steer-{args.dataset}-{args.size}")
    heads = heads_with_table2_betas(args.reproduced, out / "heads_table2.json")
    lm = juice.load_model("gemma-3-270m", device="cpu")
    artifact = juice.load_heads(heads, lm)
    validation, test = STUDY_SIZES[args.dataset][args.size]
    start = time.perf_counter()
    if args.dataset == "nqswap":
        study = run_study(lm, artifact, args.data / "nqswap", out=out, validation_limit=validation, test_limit=test,
                          keep=prompt_fits(lm.tokenizer, STUDY_MAX_PROMPT_TOKENS))
    else:
        study = run_study(lm, artifact, None, out=out, validation_limit=validation, test_limit=test)
    print(f"{time.perf_counter() - start:.0f} s; wrote {out / 'study.md'}; best static on validation: "
          f"{study.test.best_static}")


if __name__ == "__main__":
    main()
