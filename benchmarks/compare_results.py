"""Whether two results.json files hold the same tables, choices and item verdicts
(:func:`juice.pipeline.compare.compare_files`): exit 0 if so, 1 with the differences if not.

Run: python benchmarks/compare_results.py BEFORE/results.json AFTER/results.json
"""

from __future__ import annotations

import sys

from juice.pipeline.compare import compare_files


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    c = compare_files(sys.argv[1], sys.argv[2])
    print(f"{'same' if c.same else 'DIFFERENT'}: {c.compared} values compared, {len(c.differences)} differ; "
          f"largest probability difference {c.max_p_difference:.1e}; {c.shortened_outputs} outputs shortened")
    for line in c.differences:
        print(f"  {line}")
    return 0 if c.same else 1


if __name__ == "__main__":
    sys.exit(main())
