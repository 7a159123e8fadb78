# Types of the compiled request check (_request_check.c), for the type checker; the .c file documents each call.
def configure(
    schemas: tuple[bytes, ...],
    span_schema: int,
    trace_id_field: int,
    span_id_field: int,
    parent_field: int,
    key_value_schema: int,
    key_field: int,
    resource_spans_schema: int,
    resource_field: int,
    max_key: int,
    max_attribute: int,
    max_resource: int,
    max_resource_copy: int,
    /,
) -> None: ...
def span_count(body: bytes | memoryview, /) -> int | None: ...
