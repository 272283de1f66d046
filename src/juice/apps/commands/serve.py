"""`juice serve`: the OpenAI-compatible server (juice's engine, or vLLM with juice's plugin)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Optional

import typer

from juice.apps.commands.common import console, engine_kind
from juice.models import DEFAULT_MODEL

CPU_MAX_REQUEST_TOKENS = 4096
"""`juice serve`'s default `--max-request-tokens` on the CPU (:attr:`ServerLimits.max_request_tokens`;
docs/serving.md, "Limits"): a request's prompts plus its tokens to generate. One request of 24k
tokens would hold a 2-core server for minutes; on a GPU there is no default limit."""


def serve(
    model: str = typer.Option(DEFAULT_MODEL, help="embedded alias, .gguf file, model directory or hub id"),
    heads: list[Path] = typer.Option([], exists=True, dir_okay=False,
                                     help="a heads file (repeat: one per direction, e.g. parametric and contextual); "
                                          "none: the heads juice ships for an embedded model, both directions"),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8000, min=0, max=65535, help="TCP port (0: any free one)"),
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N | mps"),
    max_rows: int = typer.Option(64, min=1, help="most rows decoding at once (a JuICE request holds two per choice)"),
    max_queued: int = typer.Option(256, min=1, help="most requests waiting to start; past it: HTTP 429"),
    max_n: int = typer.Option(16, min=1, help="most choices per prompt (n)"),
    max_prompts: int = typer.Option(64, min=1, help="most prompts in one completions request"),
    max_total_tokens: int = typer.Option(0, min=0, help="most prompt + max_tokens tokens (0: the model's context)"),
    max_request_tokens: Optional[int] = typer.Option(
        None, min=0, help=f"most tokens per request, prompts plus n x max_tokens; above: HTTP 400 (default "
                          f"{CPU_MAX_REQUEST_TOKENS} on the CPU, none on a GPU; 0: none)"),
    request_timeout: float = typer.Option(600.0, min=0.0,
                                          help="seconds before a request ends with HTTP 504 (0: no limit)"),
    alias: list[str] = typer.Option([], help="NAME=SPEC: another model name whose requests get these juice "
                                             "options, e.g. gemma+juice=method:juice,direction:context "
                                             "(repeat; for lm-evaluation-harness, whose request bodies are fixed)"),
    default: Optional[str] = typer.Option(None, help="SPEC (as --alias's): the juice options of a request that sends "
                                                     "none, e.g. method:juice,beta_plus:2 (unset: the heads file's "
                                                     "tuned steering, else Original)"),
    engine: str = typer.Option("juice", help="juice (this process's engine) | vllm (vLLM's OpenAI server with "
                                             "juice's plugin, run from vLLM's environment; docs/vllm.md)"),
    dual_run: bool = typer.Option(True, help="--engine vllm: hold JuICE's second KV cache (--no-dual-run: JuNE "
                                             "and pruning only, twice the KV capacity on the dual-run layers)"),
    vllm_arg: list[str] = typer.Option([], help="--engine vllm: one more argument for vLLM's server (repeat), "
                                                "e.g. --vllm-arg=--tensor-parallel-size=2"),
):
    """OpenAI-compatible server (/v1/models, /v1/completions, /v1/chat/completions, /health,
    /metrics) with per-request steering in the body's "juice" field (needs the server extra:
    FastAPI, uvicorn, prometheus-client). Requests join the running batch at the next decoding step.

    On an embedded model, without --heads, the heads juice ships for it steer, both directions;
    the playground is at the server's root page (docs/serving.md, "The playground").

    Examples:

        juice serve --port 8000
        juice serve --model MODEL --heads heads.json \\
            --heads heads_contextual.json --port 8000
        juice serve --engine vllm --port 8000
    """
    kind = engine_kind(engine)
    check_listen(host, port)   # before the model loads: a port in use is one line, not a traceback after minutes
    if not kind.in_process:   # vLLM's OpenAI server with juice's plugin
        if max_request_tokens is not None:
            raise typer.BadParameter("--max-request-tokens is for --engine juice (vLLM bounds each prompt with "
                                     "--max-total-tokens, its max_model_len)", param_hint="--max-request-tokens")
        if alias:
            raise typer.BadParameter("--alias is for --engine juice (vLLM serves one model name; send the juice "
                                     "field, or vllm_xargs, per request)", param_hint="--alias")
        _serve_vllm(model, heads, host, port, max_total_tokens, dual_run, vllm_arg, default)
        return
    from juice.extras import require

    require("server", "juice serve")
    import uvicorn

    from juice.apps.openai_schema import ServerLimits
    from juice.apps.server import create_app, parse_alias, parse_spec
    from juice.models import load_model
    from juice.stage1 import load_heads

    try:
        aliases = dict(parse_alias(a) for a in alias)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--alias") from None
    try:
        default_options = None if default is None else parse_spec(default)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--default") from None
    for path in heads:
        load_heads(path)   # malformed files fail before the model loads
    lm = load_model(model, device=device)
    if max_request_tokens is None:
        max_request_tokens = CPU_MAX_REQUEST_TOKENS if lm.device.type == "cpu" else 0
    limits = ServerLimits(max_n=max_n, max_prompts=max_prompts, max_rows=max_rows, max_queued=max_queued,
                          request_timeout_s=request_timeout or None, max_total_tokens=max_total_tokens or None,
                          max_request_tokens=max_request_tokens or None)
    paths = list(heads) or _shipped(lm)
    artifacts = [load_heads(path, lm) for path in paths]
    try:
        app_ = create_app(lm, artifacts, limits=limits, aliases=aliases, default=default_options)
    except ValueError as err:   # an alias or default the heads cannot honour
        raise typer.BadParameter(str(err), param_hint="--default" if str(err).startswith("--default")
                                 else "--alias") from None
    console.print(f"serving {lm.name}{''.join(f', {a}' for a in aliases)} on http://{host}:{port}/v1 with heads for "
                  f"{', '.join(sorted(str(a.direction) for a in artifacts)) or 'no direction (Original only)'}; "
                  f"at most {limits.max_request_tokens or 'any number of'} tokens per request; "
                  f"the playground: http://{host}:{port}/", highlight=False)
    from juice.methods import TUNED_STEERINGS
    from juice.steering import DEFAULT_BETAS

    untuned = [str(p) for p, a in zip(paths, artifacts) if not any(a.tuned.betas(m) for m in TUNED_STEERINGS)]
    if untuned and default_options is None:
        console.print(f"[yellow]note:[/yellow] {', '.join(untuned)} holds no tuned betas (`juice tune`): a request "
                      "without a juice field gets Original there, and one asking for JuICE or JuNE without betas "
                      f"gets {DEFAULT_BETAS[0]:g} and {DEFAULT_BETAS[1]:g} with an X-Juice-Warning header")
    uvicorn.run(app_, host=host, port=port, log_level="info")


def check_listen(host: str, port: int) -> None:
    """Refuse, in one line naming the option, a host that does not resolve or a port this process
    cannot listen on (in use, or privileged), as uvicorn would bind it (SO_REUSEADDR set).

    Raises:
        typer.BadParameter: the host or the port, with the system's reason.
    """
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise typer.BadParameter(f"{host!r} does not resolve: {err.strerror}", param_hint="--host") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            why = "in use (another server?)" if err.errno == errno.EADDRINUSE else err.strerror
            raise typer.BadParameter(f"cannot listen on {host}:{port}: {why}; pick another --port",
                                     param_hint="--port") from None


def _shipped(lm) -> list[Path]:
    """Without --heads: the heads files juice ships for this model (one line each), else a line on how
    to make them (the server then runs Original only)."""
    from juice.data.records import Direction
    from juice.stage1.shipped import describe, how_to_make, shipped_files

    found = shipped_files(lm)
    for path in found.values():
        console.print(describe(path), highlight=False, markup=False)
    if not found:
        console.print(how_to_make(lm.name, Direction.PARAMETRIC), highlight=False, markup=False)
    return list(found.values())


def _serve_vllm(model: str, heads: list[Path], host: str, port: int, max_total_tokens: int, dual_run: bool,
                extra: list[str], default: str | None = None) -> None:
    """`juice serve --engine vllm`: replace this process with vLLM's OpenAI server (:mod:`juice.vllm.launch`)."""
    import os

    from juice.vllm.launch import describe, launch_plan
    from juice.vllm.options import plugin_heads

    heads = _heads_or_shipped(model, heads)
    try:   # malformed heads files, two for one direction, a default they cannot honour, a bad --vllm-arg: one line
        python, command, env = launch_plan(model, heads, host=host, port=port, dual_run=dual_run, extra=extra,
                                           default=default, max_model_len=max_total_tokens or None)
    except ValueError as err:
        raise _launch_error(err) from None
    console.print(f"starting vLLM with juice's plugin ({', '.join(sorted(plugin_heads(env).selections)) or 'no heads'}"
                  f"{', dual run' if dual_run and heads else ''}): {describe(command, env)}")
    os.execve(python, command, env)


def run_batch(
    input_file: Path = typer.Option(..., "-i", "--input-file", exists=True, dir_okay=False,
                                    help="vLLM's batch input (JSONL: custom_id, method, url, body); a body may "
                                         "carry the juice field, as juice serve takes it"),
    output_file: Path = typer.Option(..., "-o", "--output-file", dir_okay=False,
                                     help="the answers, one line per input line, in input order"),
    model: str = typer.Option(DEFAULT_MODEL, help="embedded alias, .gguf file, model directory or hub id"),
    heads: list[Path] = typer.Option([], exists=True, dir_okay=False,
                                     help="a heads file (repeat: one per direction); none: the heads juice ships "
                                          "for an embedded model"),
    default: Optional[str] = typer.Option(None, help="SPEC: the juice options of a line that sends none"),
    dual_run: bool = typer.Option(True, help="hold JuICE's second KV cache (--no-dual-run: JuNE and pruning only)"),
    vllm_arg: list[str] = typer.Option([], help="one more engine argument for vLLM (repeat)"),
):
    """vLLM's batch runner (vllm run-batch) with juice's plugin: every line's juice fields are
    checked as juice serve --engine vllm checks a request, a refused line gets a one-line error
    in its place in the output, and the rest are steered (docs/vllm.md, "Batch files").

    Examples:

        juice run-batch -i requests.jsonl -o answers.jsonl
    """
    import os

    from juice.vllm.launch import batch_plan, describe

    heads = _heads_or_shipped(model, heads)
    try:
        python, command, env = batch_plan(model, heads, input_file, output_file, dual_run=dual_run, extra=vllm_arg,
                                          default=default)
    except ValueError as err:
        raise _launch_error(err) from None
    console.print(f"running vLLM's batch runner with juice's plugin: {describe(command, env)}")
    os.execve(python, command, env)


def _heads_or_shipped(model: str, heads: list[Path]) -> list[Path]:
    """The heads files vLLM is started with: those given, else an embedded alias's shipped heads
    (the plugin checks them against the served model)."""
    from juice.data.records import Direction
    from juice.stage1.shipped import shipped_path

    return heads or [path for d in Direction if (path := shipped_path(model, d)).is_file()]


def _launch_error(err: ValueError) -> typer.BadParameter:
    """A refused vLLM launch plan as a one-line usage error naming the option at fault."""
    text = str(err)
    hint = "--default" if "JUICE_VLLM_DEFAULT" in text else "--vllm-arg" if "--additional-config" in text else "--heads"
    return typer.BadParameter(text, param_hint=hint)
