"""OTLP/JSON <-> protobuf. OTLP/JSON is not protobuf's JSON mapping: trace and span ids are hex
(not base64), enums are integers, int64s are strings, and unknown fields must be ignored.
We rewrite the ids to base64 and let protobuf's parser do the rest; a malformed id becomes an
empty one, which the ingest step rejects as a partial success like any other invalid id."""

from __future__ import annotations

import base64
import json

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

_ID_LENGTHS = {"traceId": 16, "spanId": 8, "parentSpanId": 8}


def _hex_id_to_base64(value: object, length: int) -> str:
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        raw = b""
    return base64.b64encode(raw if len(raw) == length else b"").decode("ascii")


def _fix_ids(item: dict) -> None:
    for key, length in _ID_LENGTHS.items():
        if key in item:
            item[key] = _hex_id_to_base64(item[key], length)


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON (OTLP/JSON writes it as a string)")


def decode_json(body: bytes) -> ExportTraceServiceRequest:
    """Parse an OTLP/JSON export body; raises ValueError when it is not one.

    Whatever the parsers raise on a client's bytes is a ValueError here (a 400, not a 500): besides
    their own errors, an OverflowError (`"kind": 1e400` or `Infinity` for an integer field) and a
    RecursionError (arrays or key-value lists nested hundreds deep). The request is then checked
    as protobuf like any other (otlp_http.ingest), so JSON gets no nesting protobuf would refuse."""
    try:
        data = json.loads(body, parse_constant=_not_json)
        if not isinstance(data, dict):
            raise ValueError("top level must be an object")
        for resource_spans in data.get("resourceSpans") or []:
            for scope_spans in resource_spans.get("scopeSpans") or []:
                for span in scope_spans.get("spans") or []:
                    _fix_ids(span)
                    for link in span.get("links") or []:
                        _fix_ids(link)
        return json_format.ParseDict(data, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except MemoryError:
        raise  # the server's problem, not the client's
    except Exception as exc:
        message = str(exc)
        message = message if len(message) <= 300 else message[:299] + "…"
        raise ValueError(f"undecodable OTLP/JSON: {type(exc).__name__}: {message}") from None


def encode_json(message) -> bytes:
    return json_format.MessageToJson(message, indent=None).encode()
