# Types of the compiled span encoder (_otlp_span.c), for the type checker; the .c file documents the call.
from typing import Any

def span_bytes(span: Any, /) -> bytes | None: ...
