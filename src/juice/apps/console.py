"""The `juice` console script: the command line, or one line saying how to install it."""

from __future__ import annotations

import sys

from juice.extras import MissingExtraError, require


def main() -> None:
    """Run the `juice` command line (:mod:`juice.apps.cli`).

    Raises:
        SystemExit: 2, with "error: the juice command needs the cli extra: ..." on standard error,
            when typer or rich is missing.
    """
    try:
        require("cli", "the juice command")
    except MissingExtraError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    from juice.apps.cli import run

    run()


if __name__ == "__main__":
    main()
