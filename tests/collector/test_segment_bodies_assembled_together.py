"""A WAL segment's bodies become one record batch, not one per body (one-span exports made the
worker spend ~0.7 ms per span building columns): the same rows as body by body, and a body whose
columns do not build is still quarantined alone."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from lightning_otel.collector import span_decoder
from lightning_otel.collector.pipeline import convert_segment
from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import Store
from lightning_otel.collector.wal import WriteAheadLog
from lightning_otel.testing.payloads import build_request

pytestmark = pytest.mark.skipif(not span_decoder.available(), reason="the compiled decoder is not built")


def _bodies(seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [build_request(rng.choice([1, 1, 2, 5]), training=rng.random() < 0.6) for _ in range(rng.randrange(2, 12))]


@pytest.mark.parametrize("seed", range(6))
def test_bodies_assembled_together_equal_body_by_body(seed):
    bodies = _bodies(seed)
    one_by_one = pa.Table.from_batches([span_decoder._fast_batch(body) for body in bodies], SPANS_SCHEMA)
    together = span_decoder.assemble_bodies([span_decoder.decode_body(body) for body in bodies])
    assert len(together) == 1
    assert pa.Table.from_batches(together, SPANS_SCHEMA).equals(one_by_one)


def test_a_body_the_reference_path_decodes_keeps_its_place(monkeypatch):
    bodies = _bodies(7)
    expected = pa.Table.from_batches([span_decoder._fast_batch(body) for body in bodies], SPANS_SCHEMA)
    real = span_decoder._decode_raw
    middle = bodies[len(bodies) // 2]

    def decode_raw(body):
        if body is middle:
            raise span_decoder._spans_codec.Fallback("the reference path decides")
        return real(body)

    monkeypatch.setattr(span_decoder, "_decode_raw", decode_raw)
    batches = span_decoder.assemble_bodies([span_decoder.decode_body(body) for body in bodies])
    assert len(batches) == 3  # the run before, the reference path's batch, the run after
    got = pa.Table.from_batches(batches, SPANS_SCHEMA)
    assert got.column("span_id").to_pylist() == expected.column("span_id").to_pylist()


def test_a_body_whose_columns_do_not_build_is_quarantined_alone(tmp_path, monkeypatch):
    wal = WriteAheadLog(tmp_path / "wal")
    for spans in (1, 3, 2):
        wal.append(build_request(spans, training=True))
    segment = wal.rotate()
    real = span_decoder._assemble_raws

    def assemble(raws):
        if any(raw[0] == 3 for raw in raws):
            raise ValueError("a value this column does not take")
        return real(raws)

    monkeypatch.setattr(span_decoder, "_assemble_raws", assemble)
    store = Store(tmp_path / "data")
    rows, quarantined, _ = convert_segment(store.uri, str(wal.path(segment)), segment)
    assert (rows, quarantined) == (3, 1)
    assert sorted(p.name for p in (tmp_path / "data" / "quarantine").iterdir())
