"""A golden run for refactors of the engine: `juice reproduce --limit 10` (Table 1 layout, two
domains of the paper's files) and the contextual table (Table 2 layout, the small MemoTrap and
NQ-Swap files tests/helpers/data.py writes) on the test suite's tiny random Llama, every baseline included. Run it
before and after a change and compare the results with benchmarks/compare_results.py (issue 34:
0 values may differ).

Run: python benchmarks/golden_tiny.py OUT_DIR   (needs ../shared/data beside the checkout)
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / d) for d in ("", "unit", "integration")]

from conftest import SHARED, build_tiny  # noqa: E402
from helpers.data import write_contextual_data as contextual_data  # noqa: E402

from juice.pipeline.run import ReproduceConfig
from juice.experiments.table1 import reproduce  # noqa: E402
from juice.experiments.table2 import reproduce_contextual  # noqa: E402


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    data = out / "data"
    for name in ("world_capital", "capital_copy"):
        shutil.copytree(SHARED / "data" / "paraconflict" / "world_capital", data / name, dirs_exist_ok=True)
    contextual_data(out / "contextual-data")
    lm = build_tiny("llama")
    reproduce(ReproduceConfig(out_dir=out / "table1", data=data, limit=10, validation_size=2, filter=False,
                              alphas_positive=(1.0,), alphas_negative=(-1.0,), k=2, ph3_dev_size=3,
                              bootstrap_resamples=1000), lm=lm)
    reproduce_contextual(ReproduceConfig(out_dir=out / "table2", data_root=out / "contextual-data", limit=10,
                                         validation_per_dataset=2, ph3_dev_size=2, scoring="exact",
                                         alphas_positive=(1.0,), alphas_negative=(-1.0,), k=2,
                                         bootstrap_resamples=1000), lm=lm)
    print(f"wrote {out / 'table1' / 'results.json'} and {out / 'table2' / 'results_contextual.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
