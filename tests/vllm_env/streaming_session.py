"""Run inside vLLM's environment (tests/slow/test_vllm_streaming_input.py starts it): streaming-input
sessions through vLLM's `AsyncLLM` with juice's plugin. Each session in a JSON file sends its
chunks (token ids, a `juice` steering or none, max_tokens) one after another, each once the
previous chunk's tokens are out, under `generate`'s own sampling parameters with the session's
`initial` steering (what vLLM's end-of-stream marker carries); then one ordinary request shows the engine still serves.
Writes, per session, the tokens of each chunk's output, the last finish reason and the error a
chunk raised, if any. Usage: python streaming_session.py IN.json OUT.json (the plugin's set-up
from the environment: JUICE_VLLM_HEADS)."""

import asyncio
import json
import sys


async def main() -> None:
    spec = json.load(open(sys.argv[1]))
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.protocol import StreamingInput
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    from juice.vllm import LOGITS_PROCESSOR, SCHEDULER, offline_request

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=spec["model"], dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
        logits_processors=[LOGITS_PROCESSOR], scheduler_cls=SCHEDULER, enable_prefix_caching=True))

    def params(chunk):
        _, extra = offline_request({"prompt_token_ids": chunk["ids"]}, chunk.get("juice"))
        return SamplingParams(max_tokens=chunk["max_tokens"], temperature=0.0, ignore_eos=True,
                              extra_args=extra or None)

    out = {}
    try:
        for name, session in spec["sessions"].items():
            chunks, turn_done = session["chunks"], asyncio.Event()
            initial = params({"ids": chunks[0]["ids"], "max_tokens": 3, "juice": session.get("initial")})

            async def inputs(chunks=chunks, turn_done=turn_done):
                for chunk in chunks:
                    turn_done.clear()
                    yield StreamingInput(prompt=TokensPrompt(prompt_token_ids=chunk["ids"]),
                                         sampling_params=params(chunk))
                    await asyncio.wait_for(turn_done.wait(), timeout=120)

            record = {"tokens": [], "finish_reason": None, "error": None}
            try:
                async for result in engine.generate(inputs(), initial, request_id=f"session-{name}"):
                    completion = result.outputs[0]
                    record["tokens"] = list(completion.token_ids)
                    record["finish_reason"] = completion.finish_reason
                    if completion.finish_reason is not None or result.finished:
                        turn_done.set()
            except Exception as err:   # vLLM raises a finished-with-error request's error to its caller
                record["error"] = f"{type(err).__name__}: {err}"
            out[name] = record
        after = None
        async for result in engine.generate(TokensPrompt(prompt_token_ids=spec["after"]),
                                            params({"ids": spec["after"], "max_tokens": 4}), request_id="after"):
            after = list(result.outputs[0].token_ids)
        out["after"] = after
    finally:
        engine.shutdown()
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    asyncio.run(main())
