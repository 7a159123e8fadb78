"""OTLP/gRPC receiver: opentelemetry.proto.collector.trace.v1.TraceService/Export.

Same ingest rules as HTTP. Status codes as the specification says: INVALID_ARGUMENT for bad
data, UNAUTHENTICATED without the bearer token, UNAVAILABLE with a google.rpc.RetryInfo detail
when overloaded. The receive limit is raised well above gRPC's 4 MiB default: a batch of LLM spans
with prompts and token ids is easily larger.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from lightning_otel.collector.client_errors import ClientErrorLog, grpc_peer
from lightning_otel.collector.ingest import Ingestor, Overloaded
from lightning_otel.core.auth import bearer_ok

log = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str, details: list | None = None) -> None:
    """Abort with a google.rpc.Status in the trailers (grpc-status-details-bin), as exporters expect."""
    status = status_pb2.Status(code=code.value[0], message=message, details=details or [])
    context.abort_with_status(_RichStatus(code, message, (("grpc-status-details-bin", status.SerializeToString()),)))


class _RichStatus(grpc.Status):
    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: tuple) -> None:
        self.code, self.details, self.trailing_metadata = code, details, trailing_metadata


class _TraceService:
    """Export takes the raw request bytes (no generated deserializer): an undecodable body gets
    INVALID_ARGUMENT from us rather than gRPC's INTERNAL, and valid bytes go to the log as sent."""

    def __init__(self, ingestor: Ingestor, token: str | None) -> None:
        self.ingestor = ingestor
        self.token = token
        self.client_errors = ClientErrorLog()  # one WARNING line per client per interval
        self.server_errors = ClientErrorLog()  # our bugs: one traceback per client per interval

    def export(self, body: bytes, context: grpc.ServicerContext) -> bytes:
        metadata = dict(context.invocation_metadata())
        if not bearer_ok(metadata.get("authorization"), self.token):
            _abort(context, grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        try:
            result = self.ingestor.export_body(body)
        except ValueError as exc:
            self.client_errors.warn(grpc_peer(context.peer()), str(exc))
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Overloaded as exc:
            retry = any_pb2.Any()
            retry.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=exc.retry_after_s)))
            _abort(context, grpc.StatusCode.UNAVAILABLE, str(exc), [retry])
        except OSError as exc:
            log.error("write-ahead log append failed: %s", exc)
            _abort(context, grpc.StatusCode.UNAVAILABLE, "cannot write the log")
        except Exception:  # a bug of ours on this body: INTERNAL, and not one traceback per request
            if self.server_errors.allow(grpc_peer(context.peer())) is not None:
                log.exception("export from %s failed", context.peer())
            _abort(context, grpc.StatusCode.INTERNAL, "internal error")
        response = ExportTraceServiceResponse()
        if result.rejected:
            response.partial_success.rejected_spans = result.rejected
            response.partial_success.error_message = result.message
        return response.SerializeToString()


def start_grpc_server(host: str, port: int, ingestor: Ingestor, token: str | None = None) -> tuple[grpc.Server, int]:
    """Start serving TraceService/Export on host:port; returns the server and the bound port."""
    server = grpc.server(
        ThreadPoolExecutor(max_workers=16, thread_name_prefix="lightning-otel-grpc"),
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.so_reuseport", 0)],
    )
    service = _TraceService(ingestor, token)
    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService",
        {"Export": grpc.unary_unary_rpc_method_handler(service.export)},  # bytes in, bytes out
    )
    server.add_generic_rpc_handlers((handler,))
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind gRPC to {host}:{port}")
    server.start()
    return server, bound
