"""A chat completions stream (vLLM's server-sent events) as the Anthropic Messages stream it serves:
message_start, then per content block content_block_start / content_block_delta (text_delta,
input_json_delta) / content_block_stop, then message_delta (stop reason, usage) and message_stop.
An error event of the upstream becomes Anthropic's `error` event. Standard library only."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from lightning_otel.core.anthropic_messages import error_body, message_id, stop_reason
from lightning_otel.core.vllm_endpoint import first_choice

Event = tuple[str, dict[str, Any]]  # (event name, data)


def sse(events: list[Event]) -> bytes:
    """Events as server-sent-event bytes, as Anthropic's API writes them."""
    return b"".join(
        b"event: " + name.encode() + b"\ndata: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"
        for name, data in events
    )


class MessagesStream:
    """Translates one chat stream, chunk by chunk, for the Messages request `request`; `observe`, if
    given, sees each parsed chat chunk (a recorder reads them without parsing the bytes again)."""

    def __init__(self, request: dict[str, Any], observe: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.request, self.observe = request, observe
        self.started = self.finished = False
        self.block: int | None = None  # index of the open content block
        self.blocks = 0  # content blocks started so far
        self.block_kind: str | None = None
        self.tool_blocks: dict[int, int] = {}  # chat tool call index -> content block index
        self.finish_reason: Any = None
        self.matched: Any = None  # vLLM's stop_reason: the stop string matched
        self.counted_tokens = 0  # completion ids seen (the output tokens when no usage chunk comes)
        self.usage_tokens: int | None = None  # the completion tokens of the stream's usage chunk
        self._pending = b""

    def feed(self, data: bytes) -> bytes:
        """Chat SSE bytes (any split) in, Anthropic SSE bytes out."""
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        events: list[Event] = []
        for line in lines:
            payload = line[5:].strip() if line.startswith(b"data:") else b""
            if not payload or payload == b"[DONE]":
                continue
            try:
                chunk = json.loads(payload)
            except ValueError:
                continue
            if self.observe is not None and isinstance(chunk, dict):
                self.observe(chunk)
            events.extend(self.chunk(chunk))
        return sse(events)

    def end(self, error: str | None = None) -> bytes:
        """What follows the last chunk: the closing events (nothing if they were sent), or, for a
        stream that broke off (`error`), Anthropic's error event."""
        rest, self._pending = self._pending, b""
        head = self.feed(rest + b"\n") if rest.strip() else b""
        if error is not None and not self.finished:
            self.finished = True
            return head + sse([("error", error_body(error, "api_error"))])
        return head + sse(self.finish())

    def _start(self, chunk: dict[str, Any]) -> list[Event]:
        self.started = True
        prompt_ids = chunk.get("prompt_token_ids")
        message: dict[str, Any] = {
            "id": message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": chunk.get("model") or self.request.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": len(prompt_ids) if isinstance(prompt_ids, list) else 0, "output_tokens": 0},
        }
        return [("message_start", {"type": "message_start", "message": message})]

    def _open(self, kind: str, block: dict[str, Any]) -> list[Event]:
        events = self._close()
        self.block, self.block_kind = self.blocks, kind
        self.blocks += 1
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": self.block, "content_block": block})
        )
        return events

    def _close(self) -> list[Event]:
        if self.block is None:
            return []
        index, self.block, self.block_kind = self.block, None, None
        return [("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _delta(self, index: int, delta: dict[str, Any]) -> Event:
        return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})

    def chunk(self, chunk: Any) -> list[Event]:
        """The events one parsed chat chunk adds."""
        if not isinstance(chunk, dict) or self.finished:
            return []
        if isinstance(chunk.get("error"), dict):  # vLLM's mid-stream error
            self.finished = True
            reason = str(chunk["error"].get("message") or "upstream error")
            return [("error", error_body(reason, "api_error"))]
        events = [] if self.started else self._start(chunk)
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        choice = first_choice(chunk)
        if not isinstance(choice, dict):
            return events
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self.counted_tokens += len(ids)
        delta = choice.get("delta") or {}
        text = delta.get("content")
        if text:
            if self.block_kind != "text":
                events.extend(self._open("text", {"type": "text", "text": ""}))
            events.append(self._delta(self.blocks - 1, {"type": "text_delta", "text": text}))  # the open block
        for call in delta.get("tool_calls") or ():
            events.extend(self._tool_call(call))
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
            self.matched = choice.get("stop_reason")
        return events

    def _tool_call(self, call: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        position = call.get("index", 0)
        function = call.get("function") or {}
        index = self.tool_blocks.get(position)
        if index is None:
            opened: dict[str, Any] = {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{position}",
                "name": function.get("name") or "",
                "input": {},
            }
            events.extend(self._open("tool_use", opened))
            index = self.tool_blocks[position] = self.blocks - 1  # _open made it the open block
        elif index != self.block:  # a later fragment of a call whose block was closed: cannot reopen
            return events
        if function.get("arguments"):
            events.append(self._delta(index, {"type": "input_json_delta", "partial_json": function["arguments"]}))
        return events

    def finish(self) -> list[Event]:
        """The closing events: last block stop, message_delta (stop reason, usage), message_stop."""
        if self.finished:
            return []
        self.finished = True
        events = [] if self.started else self._start({})
        events.extend(self._close())
        reason, sequence = stop_reason(
            self.finish_reason, self.matched, self.request.get("stop_sequences"), bool(self.tool_blocks)
        )
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason or "end_turn", "stop_sequence": sequence},
                    "usage": {"output_tokens": self.counted_tokens if self.usage_tokens is None else self.usage_tokens},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        return events
