"""`juice serve` under the official `openai` client. Importers skip without `openai` first
(`pytest.importorskip("openai")`)."""

from __future__ import annotations

from contextlib import contextmanager

import openai

from helpers.request_protocol import serving


@contextmanager
def serving_client(app):
    """Run `app` on 127.0.0.1 at a free port in a thread (:func:`helpers.request_protocol.serving`);
    yield an `openai` client for it."""
    with serving(app) as base:
        yield openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
