"""`juice run-batch`: vLLM's batch runner (`vllm run-batch`) with juice's plugin, every line's
juice fields checked and carried as `juice serve --engine vllm` carries them.

vLLM's batch runner builds no HTTP app, so the middleware that checks a body's `juice` field and
moves it into `vllm_xargs` (:mod:`juice.vllm.middleware`) never runs there: vLLM would drop the
field (its request models allow extra fields) and serve the line with the server's default
steering, and run beam search with `vllm_xargs.juice_*` unsteered. So the plugin refuses to start
under `vllm run-batch` (:func:`juice.vllm.processes.frontend_refusal`), and this module runs
vLLM's batch runner itself, in vLLM's Python (`python -m juice.vllm.batch -i IN -o OUT
<vLLM's engine arguments>`, which `juice run-batch` starts, :func:`juice.vllm.launch.batch_plan`):

1. each line of the input file is read as vLLM reads it (a JSON object with `custom_id`, `url`,
   `body`) and its body checked as the middleware checks a request to that route
   (:func:`check_line`): a `juice` field is moved into `vllm_xargs`, wrong fields and juice fields
   on a route juice does not steer or with beam search are refused with the middleware's
   one-line message;
2. the lines that pass go to vLLM's batch runner (`vllm.entrypoints.launchers.run_batch.main`),
   unchanged otherwise;
3. the output file holds one line per input line, in input order: vLLM's answer, or for a refused
   line (or one vLLM's runner cannot read, which would stop its whole batch) an error in vLLM's
   batch output shape (`response.status_code` 400 and `error` the message), so nothing is lost;
   it is written atomically.

Only local input and output files are taken (vLLM's runner also takes URLs).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from juice.steering_request import SteeringRequestError
from juice.vllm.middleware import STEERED_PATHS, check_body, juice_field_to_xargs, refusal


@dataclass(frozen=True)
class CheckedLine:
    """One input line after :func:`check_line`: `text` to send to vLLM (None: refused), or the
    refusal `error` with the line's `custom_id`."""

    text: str | None
    custom_id: str = ""
    error: str | None = None


def check_line(text: str, validate: Callable[[str], None] | None = None) -> CheckedLine:
    """One line of a batch input file, checked as the middleware checks a request body
    (:func:`juice.vllm.middleware.refusal`, :func:`~juice.vllm.middleware.check_body`) and with
    its `juice` field moved into `vllm_xargs` (:func:`~juice.vllm.middleware.juice_field_to_xargs`).
    `validate` (vLLM's own reading of a line, `BatchRequestInput.model_validate_json`, in
    :func:`main`) refuses a line vLLM's runner cannot read, which would stop its whole batch: such a
    line gets its error (its first line) in its place, as a refused one does.

    >>> check_line('{"custom_id": "a", "url": "/v1/embeddings", "body": {"juice": {"method": "june"}}}').error[:40]
    'juice: juice checks and steers /v1/compl'
    >>> check_line('{"custom_id": "b", "url": "/v1/chat/completions", "body": {"messages": []}}').text is not None
    True
    """
    try:
        line = json.loads(text)
    except ValueError:
        line = None
    if not isinstance(line, dict) or not isinstance(line.get("body"), dict):
        return _readable(CheckedLine(text), validate)
    body, url, custom_id = line["body"], str(line.get("url", "")), str(line.get("custom_id", ""))
    try:
        why = refusal(url, body)
        if why is not None:
            raise SteeringRequestError(why)
        if url in STEERED_PATHS:
            check_body(body)
    except SteeringRequestError as err:
        return CheckedLine(None, custom_id, str(err))
    if "juice" in body and url in STEERED_PATHS:
        return _readable(CheckedLine(json.dumps({**line, "body": juice_field_to_xargs(body)}), custom_id), validate)
    return _readable(CheckedLine(text, custom_id), validate)


def _readable(line: CheckedLine, validate: Callable[[str], None] | None) -> CheckedLine:
    """`line`, or its refusal where `validate` cannot read it (:func:`check_line`)."""
    if validate is None or line.text is None:
        return line
    try:
        validate(line.text)
    except Exception as err:   # pydantic's ValidationError, or anything vLLM's reading raises
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return CheckedLine(None, line.custom_id, f"vLLM's batch runner cannot read this line: {first}")
    return line


def error_line(custom_id: str, message: str) -> str:
    """A refused line's output, in vLLM's batch output shape (`BatchRequestOutput`)."""
    return json.dumps({"id": f"juice-{uuid.uuid4().hex}", "custom_id": custom_id,
                       "response": {"status_code": 400, "request_id": f"juice-batch-{uuid.uuid4().hex}",
                                    "body": None},
                       "error": message})


def merge(checked: list[CheckedLine], answers: list[str]) -> list[str]:
    """The output lines in input order: vLLM's `answers` (one per line sent, in the order sent)
    in the places of the lines sent, refused lines' errors in theirs.

    Raises:
        RuntimeError: vLLM answered another number of lines than it was sent.
    """
    sent = sum(c.text is not None for c in checked)
    if len(answers) != sent:
        raise RuntimeError(f"vLLM's batch runner answered {len(answers)} lines for {sent} sent")
    out, given = [], iter(answers)
    for line in checked:
        out.append(next(given) if line.text is not None else error_line(line.custom_id, line.error or ""))
    return out


def _option(argv: list[str], flags: tuple[str, ...]) -> tuple[str | None, list[str]]:
    """(the value of the first of `flags` in `argv`, `argv` without it)."""
    out, value, i = [], None, 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name in flags and value is None:
            if "=" in argv[i]:
                value, i = argv[i].split("=", 1)[1], i + 1
            elif i + 1 < len(argv):
                value, i = argv[i + 1], i + 2
            else:
                i += 1
            continue
        out.append(argv[i])
        i += 1
    return value, out


def main(argv: list[str] | None = None) -> int:
    """Run vLLM's batch runner on the checked lines (module docstring); 0, or 2 with one line on
    standard error for an input or output that is not a local file."""
    argv = list(sys.argv[1:] if argv is None else argv)
    source, argv = _option(argv, ("-i", "--input-file"))
    target, argv = _option(argv, ("-o", "--output-file"))
    for label, value in (("-i/--input-file", source), ("-o/--output-file", target)):
        if not value or value.startswith(("http://", "https://")):
            print(f"juice run-batch: {label} must be a local file (got {value!r})", file=sys.stderr)
            return 2
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        print(f"juice run-batch: cannot read {source}: {err}", file=sys.stderr)
        return 2
    reader = _vllm_reader()
    checked = [check_line(line.strip(), reader) for line in text.strip().split("\n") if line.strip()]
    refused = sum(c.text is None for c in checked)
    if refused:
        print(f"juice run-batch: {refused} of {len(checked)} lines refused (their errors are in {target})",
              file=sys.stderr)
    answers: list[str] = []
    with tempfile.TemporaryDirectory(prefix="juice-batch-") as folder:
        sent = [c.text for c in checked if c.text is not None]
        if sent:
            answers = _run_vllm(argv, sent, Path(folder))
        lines = merge(checked, answers)
        out = Path(target)
        partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
        partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.replace(partial, out)
    return 0


def _vllm_reader() -> Callable[[str], None]:
    """How vLLM's batch runner reads a line (`BatchRequestInput.model_validate_json`)."""
    from vllm.entrypoints.launchers.run_batch import BatchRequestInput

    return BatchRequestInput.model_validate_json


def _run_vllm(argv: list[str], lines: list[str], folder: Path) -> list[str]:
    """vLLM's batch runner on `lines` with its engine arguments `argv`: its output lines."""
    import asyncio

    from vllm.entrypoints.launchers.run_batch import main as run_batch_main
    from vllm.entrypoints.launchers.run_batch import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:   # what `vllm run-batch` sets up first (the spawn start method, vLLM's environment)
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup

        cli_env_setup()
    except ImportError:
        pass
    (folder / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    parser = make_arg_parser(FlexibleArgumentParser(description="juice run-batch"))
    args = parser.parse_args(["-i", str(folder / "in.jsonl"), "-o", str(folder / "out.jsonl"), *argv])
    asyncio.run(run_batch_main(args))
    return [line for line in (folder / "out.jsonl").read_text(encoding="utf-8").split("\n") if line.strip()]


__all__ = ["CheckedLine", "check_line", "error_line", "main", "merge"]


if __name__ == "__main__":
    sys.exit(main())
