"""The pipeline on vLLM without a server: :class:`OfflineWorker`, one process in vLLM's Python that
holds vLLM's offline `LLM` with juice's plugin (:func:`juice.vllm.llm_options`) and answers the
engine's asks (:class:`juice.vllm.engine.VllmEngine` with `offline=True`) in one `LLM.generate`
call per batch: no HTTP, no port, no request overhead per prompt.

Why a process of its own: vLLM lives in its own Python environment (its CPU build pins
transformers below juice's floor), so juice's process cannot import it; the worker runs the
module :func:`main` in vLLM's Python with the plugin's environment
(:func:`juice.vllm.launch.launch_plan`) and talks to juice's process over its standard input and a
copy of its standard output, one JSON line per message; everything vLLM prints goes to the log.
vLLM's engine arguments are the server's command line less what only a server takes
(:func:`engine_arguments`), so both transports run the same engine with the same settings.

Messages: the worker says `{"ready": seconds}` once `LLM` is built (or `{"error": line}` and exits);
then for each `{"asks": [...]}` (an ask: `ids`, `xargs` (the request protocol's flat
`extra_args`), `max_tokens`, `stop`, `probes`, `prompt_logprobs`) it answers `{"results": [...]}`
in the order asked, each with the shapes vLLM's OpenAI server gives (`token_ids`, the first step's
`top_logprobs` as `{"token_id:<id>": logprob}`, `prompt_logprobs` as `[{"<id>": logprob}]`), so
that one parser reads both transports.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SERVER_ONLY = {"--host": 1, "--port": 1, "--served-model-name": 1, "--middleware": 1, "--api-key": 1,
               "--uvicorn-log-level": 1, "--root-path": 1, "--ssl-keyfile": 1, "--ssl-certfile": 1,
               "--allowed-origins": 1, "--enable-auto-tool-choice": 0, "--disable-log-requests": 0}
"""vLLM server options that the offline `LLM` does not take -> how many values follow them."""


def engine_arguments(command: Sequence[str]) -> list[str]:
    """vLLM's engine arguments in a server command (:func:`juice.vllm.launch.server_command`): the
    arguments after the server's module, less the options only a server takes (:data:`SERVER_ONLY`).

    Raises:
        ValueError: `command` does not run vLLM's OpenAI server module.
    """
    command = list(command)
    try:
        start = command.index("vllm.entrypoints.openai.api_server") + 1
    except ValueError:
        raise ValueError("not a vLLM OpenAI server command (no vllm.entrypoints.openai.api_server)") from None
    out, args, i = [], command[start:], 0
    while i < len(args):
        name = args[i].split("=")[0]
        if name in SERVER_ONLY:
            i += 1 + (SERVER_ONLY[name] if "=" not in args[i] else 0)
            continue
        out.append(args[i])
        i += 1
    return out


class OfflineWorkerError(RuntimeError):
    """The offline worker stopped, could not start, or answered with an error (one line)."""


class OfflineWorker:
    """vLLM's offline `LLM` in a process of vLLM's Python (module docstring).

    Args:
        python: vLLM's Python (:func:`juice.vllm.launch.find_vllm_python`).
        args: vLLM's engine arguments (:func:`engine_arguments`).
        env: the worker's environment (the plugin's variables: :func:`juice.vllm.launch.launch_plan`).
        log: the file vLLM's output is appended to.
        cwd: the worker's folder.
    """

    def __init__(self, python: str, args: Sequence[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        self.log = Path(log)
        with open(self.log, "ab") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} offline LLM: {' '.join(args)}\n".encode())
            out.flush()
            self.process = subprocess.Popen([python, "-m", "juice.vllm.offline"], env=env, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=out, start_new_session=True,
                                            cwd=str(cwd))
        self._send({"args": list(args)})

    def wait_ready(self, timeout: float) -> float:
        """Seconds the worker took to build `LLM`, once it has.

        Raises:
            OfflineWorkerError: it stopped, answered an error, or took longer than `timeout` s.
        """
        return float(self._receive(timeout)["ready"])

    def ask(self, asks: list[dict[str, Any]], timeout: float = 24 * 3600.0) -> list[dict[str, Any]]:
        """Each ask's result, in order (module docstring: the shapes).

        Raises:
            OfflineWorkerError: the worker stopped or answered an error.
        """
        self._send({"asks": asks})
        return self._receive(timeout)["results"]

    def poll(self) -> int | None:
        return self.process.poll()

    def _send(self, message: dict) -> None:
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise OfflineWorkerError(f"vLLM's offline worker stopped (exit {self.process.poll()})") from None

    def _receive(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        stream = self.process.stdout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OfflineWorkerError(f"vLLM's offline worker did not answer within {timeout:.0f} s (log: "
                                         f"{self.log})")
            ready, _, _ = select.select([stream], [], [], min(left, 1.0))
            if ready:
                line = stream.readline()
                if line:
                    message = json.loads(line)
                    if "error" in message:
                        raise OfflineWorkerError(message["error"])
                    return message
                self.process.wait()
            if self.process.poll() is not None:
                raise OfflineWorkerError(f"vLLM's offline worker stopped (exit {self.process.returncode})")


def _sampling(ask: dict[str, Any]):
    from vllm import SamplingParams

    probes = sorted(set(ask.get("probes") or ()))
    return SamplingParams(temperature=0.0, max_tokens=int(ask["max_tokens"]), ignore_eos=True,
                          stop_token_ids=list(ask.get("stop") or ()) or None,
                          logprobs=len(probes) if probes else None, logprob_token_ids=probes or None,
                          prompt_logprobs=0 if ask.get("prompt_logprobs") else None,
                          extra_args=dict(ask.get("xargs") or {}) or None)


def _result(output) -> dict[str, Any]:
    """One `RequestOutput` in the OpenAI server's shapes (module docstring)."""
    completion = output.outputs[0]
    steps = completion.logprobs or []
    top = [{f"token_id:{t}": float(lp.logprob) for t, lp in steps[0].items()}] if steps else []
    prompt = [None if step is None else {str(t): float(lp.logprob) for t, lp in step.items()}
              for step in (output.prompt_logprobs or [])]
    return {"token_ids": list(completion.token_ids), "top_logprobs": top, "prompt_logprobs": prompt}


def _llm(args: list[str]):
    """vLLM's `LLM` from engine arguments, with juice's plugin options (:func:`juice.vllm.llm_options`,
    merged into an `additional_config` the arguments give)."""
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from juice.vllm import llm_options

    parsed = EngineArgs.from_cli_args(EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(args))
    defaults = EngineArgs.from_cli_args(EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args([]))
    kwargs = {name: value for name, value in vars(parsed).items() if value != getattr(defaults, name, None)}
    options = llm_options()
    options["additional_config"] = {**(kwargs.pop("additional_config", None) or {}), **options["additional_config"]}
    kwargs.update(options)
    return LLM(**kwargs)


def _line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def main() -> None:
    """The worker (module docstring): run in vLLM's Python as `python -m juice.vllm.offline`."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)   # what vLLM prints goes to the log, not into the answers
    sys.stdout = sys.stderr

    def say(message: dict) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    first = json.loads(sys.stdin.readline())
    started = time.perf_counter()
    try:
        llm = _llm(first["args"])
    except BaseException as err:   # the one line goes to juice's process
        say({"error": f"vLLM's offline LLM did not start: {_line(err)}"})
        raise
    say({"ready": time.perf_counter() - started})
    for line in sys.stdin:
        asks = json.loads(line)["asks"]
        try:
            outputs = llm.generate([{"prompt_token_ids": a["ids"]} for a in asks], [_sampling(a) for a in asks],
                                   use_tqdm=False)
        except Exception as err:   # a refused request: juice's process raises it
            say({"error": f"vLLM answered: {_line(err)}"})
            continue
        say({"results": [_result(o) for o in outputs]})


__all__ = ["SERVER_ONLY", "OfflineWorker", "OfflineWorkerError", "engine_arguments", "main"]


if __name__ == "__main__":
    main()
