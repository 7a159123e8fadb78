# Types of the compiled body scanner (_vllm_tokens.c), for the type checker; the .c file documents the call.
from typing import Any

def cut(body: bytes, chat: bool, strip_ids: bool, strip_logprobs: bool, /) -> tuple[str, Any, Any, Any, Any] | None: ...
