"""How `juice ... --help` lays out a command's help: click's plain layout, which wraps every
paragraph and every option's help to the terminal (80 columns at most) and cuts nothing, with a
command's summary its first sentence and its indented lines (the examples) kept as written.

A command's docstring (or `help`) is its first paragraph, the summary; more paragraphs; then an
`Examples:` paragraph followed by the example commands indented by four spaces, one per line,
each short enough for 80 columns (tested). The indented lines are a code block on the site's
command-line reference (mkdocs-typer writes the help as Markdown)."""

from __future__ import annotations

import inspect
import re

import typer.core

MARKUP = None
"""The Typers' `rich_markup_mode`: None is click's plain layout (rich's boxes squeeze a help
column to a few words at 80 columns and cut option values with an ellipsis)."""


ABBREVIATIONS = frozenset({"App", "Fig", "Sec", "Alg", "Eq", "Tab", "e.g", "i.e", "vs", "cf"})
"""Words a period follows without ending a sentence (the paper's "App. D", "Fig. 3")."""


def summary(help_text: str) -> str:
    """The first sentence of a help text's first paragraph, on one line: the command's line in
    `juice --help` (click would otherwise cut it at about 45 characters with "...")."""
    first = " ".join(inspect.cleandoc(help_text).split("\n\n")[0].split())
    for match in re.finditer(r"(\S+)[.!?]\s+(?=[A-Z`])", first):
        if match.group(1) not in ABBREVIATIONS:
            return first[:match.start() + len(match.group(1)) + 1]   # through the period
    return first


def keep_indented(help_text: str) -> str:
    """`help_text` with each indented paragraph marked (click's `\\b`) so that click keeps its
    lines as written instead of joining them into one wrapped paragraph."""
    paragraphs = inspect.cleandoc(help_text).split("\n\n")
    return "\n\n".join(f"\b\n{p}" if p.startswith(" ") else p for p in paragraphs)


class HelpCommand(typer.core.TyperCommand):
    """A `juice` command whose help keeps its indented example lines as written (:func:`keep_indented`)."""

    def format_help_text(self, ctx, formatter) -> None:
        if not self.help:
            return
        formatter.write_paragraph()
        with formatter.indentation():
            formatter.write_text(keep_indented(self.help).partition("\f")[0])


class HelpGroup(typer.core.TyperGroup):
    """A `juice` command group (`juice`, `juice analyze`) laid out as :class:`HelpCommand`."""

    def format_help_text(self, ctx, formatter) -> None:
        HelpCommand.format_help_text(self, ctx, formatter)


def command_options(help_text: str | None) -> dict:
    """`Typer.command`'s keyword arguments for a command with `help_text`: the class that lays
    out its help and its one-sentence summary."""
    return {"cls": HelpCommand, **({"short_help": summary(help_text)} if help_text else {})}


__all__ = ["HelpCommand", "HelpGroup", "MARKUP", "command_options", "keep_indented", "summary"]
