"""Size caps on attributes and resources, checked on receipt; spans over them are rejected with
OTLP's partial success (`rejected_spans` and an `error_message`), the rest of the export kept.

The caps are generous on purpose: training spans carry token-id arrays and message JSON of
megabytes, and nothing here caps those below the request body's own limit. What they bound is
what the store multiplies: a resource's attributes are stored with every one of its spans, so a
resource's bytes times its spans is capped, and so is one resource (its service.name included:
a 10 MB one is kept, see store.partition_value for its directory). Keys are names, not data.

  MAX_KEY_BYTES             an attribute key (a span's, its events' and links', a resource's)
  MAX_ATTRIBUTE_BYTES       one attribute, key and value as encoded (protobuf)
  MAX_RESOURCE_BYTES        a resource (its attributes), as encoded
  MAX_RESOURCE_COPY_BYTES   per ResourceSpans: the resource's bytes x its spans

The receiver's quick check (_request_check.c) sends any body that may pass a cap to this module's
upb path, measuring on the wire (never less than protobuf's ByteSize here), so both paths reject
the same spans (tests/collector/test_collector_ingest_hostile.py).
"""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

MAX_KEY_BYTES = 4 * 1024
MAX_ATTRIBUTE_BYTES = 16 * 1024 * 1024
MAX_RESOURCE_BYTES = 16 * 1024 * 1024
MAX_RESOURCE_COPY_BYTES = 256 * 1024 * 1024


def _key_too_long(attributes) -> bool:
    return any(len(kv.key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES for kv in attributes)


def _span_over(span) -> str | None:
    """Which cap a span passes, or None."""
    groups = [span.attributes, *(event.attributes for event in span.events), *(link.attributes for link in span.links)]
    for attributes in groups:
        if _key_too_long(attributes):
            return f"an attribute key over {MAX_KEY_BYTES} bytes"
        if any(kv.ByteSize() > MAX_ATTRIBUTE_BYTES for kv in attributes):
            return f"an attribute over {MAX_ATTRIBUTE_BYTES} bytes"
    return None


def _resource_over(resource_spans) -> str | None:
    resource = resource_spans.resource
    size = resource.ByteSize()
    spans = sum(len(scope.spans) for scope in resource_spans.scope_spans)
    if _key_too_long(resource.attributes):
        return f"a resource attribute key over {MAX_KEY_BYTES} bytes"
    if size > MAX_RESOURCE_BYTES:
        return f"a resource of {size} bytes (cap {MAX_RESOURCE_BYTES})"
    if size * spans > MAX_RESOURCE_COPY_BYTES:
        return f"a resource of {size} bytes with {spans} spans (stored with each; cap {MAX_RESOURCE_COPY_BYTES} bytes)"
    return None


def drop_oversized(request: ExportTraceServiceRequest) -> tuple[int, str]:
    """Remove the spans over a cap in place; return how many and why (the first reason met)."""
    rejected, reason = 0, ""
    kept_resources = []
    for resource_spans in request.resource_spans:
        over = _resource_over(resource_spans)
        if over is not None:
            rejected += sum(len(scope.spans) for scope in resource_spans.scope_spans)
            reason = reason or over
            continue
        kept_resources.append(resource_spans)
        for scope in resource_spans.scope_spans:
            verdicts = [_span_over(span) for span in scope.spans]
            if not any(verdicts):
                continue
            rejected += sum(1 for v in verdicts if v)
            reason = reason or next(v for v in verdicts if v)
            kept = [span.SerializeToString() for span, v in zip(scope.spans, verdicts) if not v]
            del scope.spans[:]
            for raw in kept:
                scope.spans.add().ParseFromString(raw)
    if len(kept_resources) != len(request.resource_spans):
        kept_raw = [r.SerializeToString() for r in kept_resources]
        del request.resource_spans[:]
        for raw in kept_raw:
            request.resource_spans.add().ParseFromString(raw)
    return rejected, reason
