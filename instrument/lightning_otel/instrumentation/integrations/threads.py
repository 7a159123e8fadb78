"""Rollout context across threads: work handed to a thread runs in the OpenTelemetry context of
the code that handed it over (ThreadPoolExecutor.submit, Thread.start), so LLM calls and tools in
worker threads still land in their rollout. asyncio tasks inherit context by themselves."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from opentelemetry import context as context_api

from lightning_otel.instrumentation.options import Options

NAME = "threading"
TRIGGER = None  # turned on when this module is imported (now, if it already is)
_originals: dict[str, Any] = {}


def available() -> bool:
    return True


def _in_context(ctx, fn):
    def run(*args, **kwargs):
        token = context_api.attach(ctx)
        try:
            return fn(*args, **kwargs)
        finally:
            context_api.detach(token)

    return run


def enable(tracer_provider: Any, options: Options) -> None:
    if _originals:
        return
    _originals["submit"], _originals["start"] = ThreadPoolExecutor.submit, threading.Thread.start

    def submit(self, fn, /, *args, **kwargs):
        return _originals["submit"](self, _in_context(context_api.get_current(), fn), *args, **kwargs)

    def start(self):
        self.run = _in_context(context_api.get_current(), self.run)
        return _originals["start"](self)

    ThreadPoolExecutor.submit = submit
    threading.Thread.start = start


def disable() -> None:
    if _originals:
        ThreadPoolExecutor.submit, threading.Thread.start = _originals.pop("submit"), _originals.pop("start")
