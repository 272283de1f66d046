"""Continuous batching (streams joining and leaving a running batch between steps): the names
this module has always offered, now defined in :mod:`juice.engine.session`, the one decoding
loop (issue 34). New code imports from :mod:`juice.engine`."""

from __future__ import annotations

from juice.engine.session import DecodingSession, StepToken

__all__ = ["DecodingSession", "StepToken"]
