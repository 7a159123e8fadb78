"""A conversion whose list columns list_pages cannot write still stores every span (pyarrow writes
the file), and the collector's process counts and logs it: the counts live in the worker that
wrote the file, so they travel back with the conversion's result."""

from __future__ import annotations

import logging

import pyarrow.parquet as pq

from lightning_otel.collector import list_pages
from lightning_otel.collector.pipeline import Pipeline, convert_segment
from lightning_otel.collector.store import Store
from lightning_otel.collector.wal import WriteAheadLog
from lightning_otel.testing.payloads import build_request


def _stored(store: Store) -> list[list[int] | None]:
    rows = []
    for info in store.files():
        rows += pq.read_table(info.path, columns=["completion_token_ids"]).column(0).to_pylist()
    return rows


def test_a_segment_list_pages_does_not_write_is_converted_and_its_fallback_returned(tmp_path, monkeypatch):
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append(build_request(3, training=True))
    segment = wal.rotate()
    store = Store(tmp_path / "data")
    rows, quarantined, fallbacks = convert_segment(store.uri, str(wal.path(segment)), segment)
    assert (rows, quarantined, fallbacks) == (3, 0, {})  # training spans: list_pages writes them
    expected = _stored(store)
    assert len(expected) == 3 and all(len(ids) == 512 for ids in expected)

    wal.append(build_request(3, training=True))
    segment = wal.rotate()
    other = Store(tmp_path / "other")
    monkeypatch.setattr(list_pages, "_PLAIN_TYPES", ())  # as if the schema's element types were others
    assert convert_segment(other.uri, str(wal.path(segment)), segment) == (3, 0, {"element type": 1})
    assert _stored(other) == expected


def test_the_pipeline_counts_fallbacks_and_logs_each_kind_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(list_pages, "_PLAIN_TYPES", ())
    store = Store(tmp_path / "data")
    wal = WriteAheadLog(tmp_path / "wal")
    pipeline = Pipeline(store, wal, flush_interval_s=60.0, workers=0)
    with caplog.at_level(logging.WARNING, logger="lightning_otel.collector.pipeline"):
        for _ in range(2):
            wal.append(build_request(2, training=True))
            pipeline.flush()
    assert pipeline.list_page_fallbacks == {"element type": 2}
    assert pipeline.spans_written == 4
    logged = [r.getMessage() for r in caplog.records if r.name == "lightning_otel.collector.pipeline"]
    assert len(logged) == 1 and "element type" in logged[0]
