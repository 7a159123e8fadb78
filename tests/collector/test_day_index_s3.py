"""Day indexes (collector/day_index.py) on object storage: a real S3-compatible server (moto's, the
fixture of test_collector_s3.py). A lookup lists only the days that may hold its rollout; a write
removes its day's index, also when a build runs between the writer's first delete and its PUT."""

from __future__ import annotations

import pyarrow.fs as pafs
from lookup_helpers import ListingSpy
from test_collector_s3 import s3_endpoint  # noqa: F401  (the fixture)
from test_day_index import INDEX_NAME, QUERIES, _write

from lightning_otel.collector import connect, day_index, rollout_index
from lightning_otel.collector.day_index import DayIndex, DayListing, build_day_index
from lightning_otel.collector.store import Store


def test_on_an_object_store(s3_endpoint):  # noqa: F811
    store = Store("s3://traces/day-index")
    store.ensure_schema_file()
    _write(store, ["s3-a"], 1, 0)
    _write(store, ["s3-b"], 25, 0)
    days = sorted(store.day_dirs()[1])
    assert len(days) == 2 and all(build_day_index(store, day) for day in days)
    listed: list[str] = []
    spied = Store(store.uri)
    spied.fs = ListingSpy(spied.fs, listed)
    found = DayListing(spied).more(rollout_index.keys(["s3-a"]))
    assert {day_index.day_of(store, info.path) for info in found} - {None} == {days[0]}  # None: the schema file
    assert not any(path.startswith(days[1]) for path in listed)
    count, whole = QUERIES[1], connect(store.uri)  # one query each: DuckDB over S3 is slow

    def lookup(rollout: str) -> list:
        found = connect(store.uri, rollout_ids=[rollout]).execute(count, [rollout]).fetchall()
        assert found == whole.execute(count, [rollout]).fetchall()
        return found

    assert lookup("s3-a") == lookup("s3-b") == [(4,)]
    _write(store, ["s3-c"], 26, 1)
    assert store.fs.get_file_info(f"{days[1]}/{INDEX_NAME}").type == pafs.FileType.NotFound
    assert not DayIndex(store, days[1]).trusted() and DayIndex(store, days[0]).trusted()

    # A build between a writer's first delete and its PUT: the writer's second delete removes its index.
    class BuildBeforeEachPut:
        def __init__(self, real) -> None:
            self.real = real

        def open_output_stream(self, path: str, *args, **kwargs):
            if path.endswith(".parquet"):
                assert build_day_index(Store(store.uri), days[1])
            return self.real.open_output_stream(path, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.real, name)

    assert build_day_index(store, days[1])
    writer = Store(store.uri)
    writer.fs = BuildBeforeEachPut(writer.fs)
    _write(writer, ["s3-d"], 26, 2)
    assert not DayIndex(store, days[1]).trusted()
    whole = connect(store.uri)
    assert lookup("s3-c") == lookup("s3-d") == [(4,)]
