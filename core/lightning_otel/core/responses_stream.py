"""A chat-completions stream as the Responses API's stream of events (responses_api.py says why).

    stream = ResponsesStream(request)         # the Responses request
    events = stream.start()                   # response.created, response.in_progress
    events += stream.feed(chat_chunk)         # per chat chunk (a dict): deltas as output items
    events += stream.finish()                 # the items' done events, response.completed
    b"".join(map(sse, events))                # the wire format

The events are those the OpenAI SDK's stream helpers accumulate (output_item.added/done,
content_part.added/done, output_text.delta/done, function_call_arguments.delta/done), each with its
sequence_number. One output item is open at a time: text, then each tool call in turn, as vLLM
streams them. Standard library only: this runs in agents.
"""

from __future__ import annotations

import json
import time
from typing import Any

from lightning_otel.core.responses_api import (
    error_body,
    function_call_item,
    message_item,
    new_id,
    output_logprobs,
    response_shell,
    usage,
    wants_logprobs,
)


def sse(event: dict[str, Any]) -> bytes:
    """One server-sent event, as the Responses API sends it (named, JSON data)."""
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


class ResponsesStream:
    def __init__(self, request: dict[str, Any], response_id: str | None = None) -> None:
        self.request = request
        self.id = response_id or new_id("resp")
        self.created: float = time.time()
        self.model = request.get("model")
        self.logprobs = wants_logprobs(request)
        self.output: list[dict[str, Any]] = []  # finished items
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.open_tool_index: int | None = None  # its chat tool-call index, when a function call
        self.text: list[str] = []
        self.text_logprobs: list[dict] = []
        self.finish_reason: Any = None
        self.usage: dict | None = None
        self.sequence = 0

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _snapshot(self, in_progress: bool) -> dict[str, Any]:
        return response_shell(
            self.request,
            self.id,
            self.created,
            self.model,
            finish_reason=self.finish_reason,
            output=list(self.output),
            usage=self.usage,
            in_progress=in_progress,
        )

    def start(self) -> list[dict[str, Any]]:
        return [
            self._event("response.created", response=self._snapshot(True)),
            self._event("response.in_progress", response=self._snapshot(True)),
        ]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events for one chat-completions chunk."""
        events: list[dict[str, Any]] = []
        if chunk.get("model"):
            self.model = chunk["model"]
        if chunk.get("created"):
            self.created = chunk["created"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = usage(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # n > 1: a Response has one output; the first choice is it
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events += self._text_delta(delta["content"], (choice.get("logprobs") or {}).get("content"))
            for call in delta.get("tool_calls") or ():
                events += self._tool_delta(call)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
        return events

    def _text_delta(self, text: str, logprobs: Any) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self.open is None or self.open["type"] != "message":
            events += self._close()
            self.open, self.text, self.text_logprobs = message_item(new_id("msg"), "", "in_progress"), [], []
            self.open["content"] = []
            index = len(self.output)
            events.append(self._event("response.output_item.added", output_index=index, item=_copy(self.open)))
            part = {"type": "output_text", "text": "", "annotations": []}
            if self.logprobs:
                part["logprobs"] = []
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=self.open["id"],
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            )
        entries = output_logprobs(logprobs) if self.logprobs else []
        self.text.append(text)
        self.text_logprobs += entries
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=self.open["id"],
                output_index=len(self.output),
                content_index=0,
                delta=text,
                logprobs=entries,
            )
        )
        return events

    def _tool_delta(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        index = call.get("index", 0)
        function = call.get("function") or {}
        if self.open is None or self.open["type"] != "function_call" or self.open_tool_index != index:
            events += self._close()
            self.open = function_call_item(
                new_id("fc"), call.get("id") or new_id("call"), function.get("name") or "", "", "in_progress"
            )
            self.open_tool_index = index
            events.append(
                self._event("response.output_item.added", output_index=len(self.output), item=_copy(self.open))
            )
        elif function.get("name"):
            self.open["name"] += function["name"]
        if function.get("arguments"):
            self.open["arguments"] += function["arguments"]
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=self.open["id"],
                    output_index=len(self.output),
                    delta=function["arguments"],
                )
            )
        return events

    def _close(self) -> list[dict[str, Any]]:
        """The done events of the open item, which joins the output."""
        item, self.open, self.open_tool_index = self.open, None, None
        if item is None:
            return []
        index, events = len(self.output), []
        if item["type"] == "message":
            text = "".join(self.text)
            item = message_item(item["id"], text, "completed", self.text_logprobs if self.logprobs else None)
            part = item["content"][0]
            events.append(
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=text,
                    logprobs=self.text_logprobs,
                )
            )
            events.append(
                self._event(
                    "response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part
                )
            )
        else:
            item["status"] = "completed"
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        events.append(self._event("response.output_item.done", output_index=index, item=_copy(item)))
        self.output.append(item)
        return events

    def finish(self) -> list[dict[str, Any]]:
        """After the chat stream's last chunk: close the open item, then response.completed (or
        response.incomplete when the model stopped at max_output_tokens)."""
        events = self._close()
        snapshot = self._snapshot(False)
        kind = "response.incomplete" if snapshot["status"] == "incomplete" else "response.completed"
        return events + [self._event(kind, response=snapshot)]

    def fail(self, message: str, code: str = "server_error") -> list[dict[str, Any]]:
        """The chat stream broke off: response.failed, whose error says why."""
        snapshot = self._snapshot(False)
        snapshot["status"], snapshot["error"] = "failed", {"code": code, "message": message}
        return [self._event("response.failed", response=snapshot)]


def error_event(message: str, code: str | None = None) -> dict[str, Any]:
    """An `error` event, for a failure before any response existed."""
    return {"type": "error", "sequence_number": 0, **error_body(message, "server_error", None, code)["error"]}


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(item))
