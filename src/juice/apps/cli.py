"""The `juice` command line: parses, calls the library, prints. The commands live in
:mod:`juice.apps.commands` (one module per command group); this module registers them and runs
them with one-line errors (:func:`main`)."""

from __future__ import annotations

import typer

from juice.apps.commands import COMMANDS
from juice.apps.help_format import MARKUP, HelpGroup, command_options

app = typer.Typer(name="juice", add_completion=False, cls=HelpGroup, rich_markup_mode=MARKUP,
                  help="Steer a language model toward its parametric memory or its context (JuICE, JuNE, "
                       "the paper's baselines). Every command: juice COMMAND --help.")


def _add_analyze() -> None:
    from juice.apps.analyze import analyze_app

    app.add_typer(analyze_app, name="analyze", short_help="The paper's analyses: knockout (Fig. 3), superposition, "
                  "interventions (Table 3, Fig. 6), robustness (Fig. 5), paraphrase (App. D), norm; all.")


_add_analyze()
for _command in COMMANDS:
    app.command(**command_options(_command.__doc__))(_command)


RESUME = "interrupted: finished stages are saved; run the same command again to resume"


def _one_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    first = text.splitlines()[0]
    return first + (" (...)" if len(text.splitlines()) > 1 else "")


def main(argv: list[str] | None = None) -> int:
    """The `juice` entry point: bad input (a missing or malformed file, an unknown model, a heads
    file for another model, a prompt too long, a model that loaded wrong, ...) ends with one line
    on stderr and exit status 2, never a traceback; usage errors (a bad option value, a missing
    file option) print click's usage hint and one `Error:` line, status 2; Ctrl-C ends with 130
    (for `reproduce` and `identify` with a reminder that re-running resumes). `JUICE_DEBUG=1`
    shows the traceback instead. Other exceptions (bugs) keep their traceback.

    Returns:
        The exit status.
    """
    import os
    import sys

    from juice.extras import MissingExtraError
    from juice.engine.guard import BatchingMismatchError
    from juice.selfcheck import ModelLoadError

    args = sys.argv[1:] if argv is None else list(argv)
    resumable = bool(args) and args[0] in ("reproduce", "identify", "sweep")
    interrupted = RESUME if resumable else "interrupted"
    user_errors = (OSError, ValueError, ModelLoadError, BatchingMismatchError, MissingExtraError)
    try:
        command = typer.main.get_command(app)   # click's own call: no rich traceback for bad input
        result = command.main(args=args, prog_name="juice", standalone_mode=False)
        if result == 130:   # typer turns Ctrl-C into exit status 130
            print(interrupted, file=sys.stderr)
        return result if isinstance(result, int) else 0
    except typer.TyperException as usage:   # usage errors: a bad option value, a missing file option
        if hasattr(usage, "show"):
            usage.show()
        else:
            print(f"error: {_one_line(usage)}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, typer.Abort):
        print(interrupted, file=sys.stderr)
        return 130
    except user_errors as err:
        if os.environ.get("JUICE_DEBUG"):
            raise
        print(f"error: {_one_line(err)} (JUICE_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 2


def run() -> None:
    """Console-script target: :func:`main` with the process's arguments and exit status."""
    raise SystemExit(main())


if __name__ == "__main__":
    run()
