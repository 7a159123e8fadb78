# Types of the compiled decoder (_spans_codec.c), for the type checker; the .c file documents each call.
from collections.abc import Callable
from typing import Any

class Fallback(ValueError): ...

def decode(
    body: bytes | memoryview,
    slots: dict[Any, int],
    n_scalars: int,
    widths: tuple[int, ...],
    kinds: tuple[Any, ...],
    statuses: tuple[Any, ...],
    service_key: str,
    text_of: Callable[..., Any],
    list_value: Callable[..., Any],
    events_json: Callable[..., Any],
    fallback_of: Callable[..., Any],
    operation_kinds: dict[Any, Any],
    /,
) -> tuple[Any, Any, Any, Any, Any, Any]: ...
def keep_freed_memory(max_block: int, /) -> bool: ...
