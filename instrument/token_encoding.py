"""Packed encoding of token ids and logprobs as span attributes.

A 4,096-token prompt as an OTLP int array is 4,096 AnyValue messages: the collector would have to
touch each in Python. Packed, it is one bytes value (little-endian int32 ids, float64 logprobs)
that the collector turns into a list column with no per-token Python work. OpenTelemetry SDKs
that cannot carry bytes attributes (before opentelemetry-api 1.4x passed bytes through) send the
same bytes as a base64 string; the collector accepts both. Standard library only (agent side).
"""

from __future__ import annotations

import base64
import sys
from array import array
from typing import Sequence

_BIG_ENDIAN = sys.byteorder == "big"


def _bytes_attributes_supported() -> bool:
    try:
        from opentelemetry.attributes import BoundedAttributes

        return isinstance(BoundedAttributes(attributes={"probe": b"\xff"})["probe"], bytes)
    except Exception:  # noqa: BLE001 - any failure means: fall back to base64 text
        return False


BYTES_SUPPORTED = _bytes_attributes_supported()


def _pack(typecode: str, values: Sequence) -> bytes:
    packed = array(typecode, values)
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def _unpack(typecode: str, data: bytes | str) -> list:
    packed = array(typecode)
    packed.frombytes(base64.b64decode(data, validate=True) if isinstance(data, str) else data)
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tolist()


def _attribute(data: bytes) -> bytes | str:
    return data if BYTES_SUPPORTED else base64.b64encode(data).decode("ascii")


def pack_ints(values: Sequence[int]) -> bytes | str:
    """Token ids -> packed attribute value (little-endian int32)."""
    return _attribute(_pack("i", values))


def pack_floats(values: Sequence[float]) -> bytes | str:
    """Logprobs -> packed attribute value (little-endian float64: exact)."""
    return _attribute(_pack("d", values))


def unpack_ints(value: bytes | str) -> list[int]:
    return _unpack("i", value)


def unpack_floats(value: bytes | str) -> list[float]:
    return _unpack("d", value)
