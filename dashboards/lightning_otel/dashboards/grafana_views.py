"""`lightning-otel grafana-views`: a DuckDB database file that holds only the trace views, for Grafana.

Grafana's DuckDB datasource (the MotherDuck plugin) opens one database file. This writes one whose
only contents are the views of collector/lightning_otel/collector/query.py (spans, llm_calls, rollouts, train_steps, ...) over
an absolute read_parquet glob of the store. The file holds no data: every query re-lists and re-reads
the Parquet files, so new spans show up in Grafana without rewriting the file, and the collector
never shares a lock with Grafana (which opens the file read-only).

Rewrite it only when the store moves or after upgrading lightning-otel (new view definitions). The
write is atomic (temporary file, then rename), so a Grafana that opens the file mid-write sees the old
file or the new one, never half of one.

Local stores only: the plugin's DuckDB would need credentials and an S3 extension of its own for an
object store, which this file cannot carry safely. The path in the glob is the absolute path here, so
Grafana must see the store at the same path (docs/grafana.md mounts it at the same path in Docker).

Stdlib only at import time: the CLI imports this module to register the subcommand.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# DuckDB writes its newest storage format by default, which the older DuckDB inside the Grafana
# plugin refuses ("database file with version number 999"). The v1.0.0 format is readable by every
# DuckDB since 1.0, and a file of views needs nothing newer.
STORAGE_COMPATIBILITY = "v1.0.0"


class ViewsFileError(Exception):
    """The views file cannot be written; the message says why and what to do."""


def _remove(*paths: Path) -> None:
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def write_views_file(data_dir: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write `out`: a DuckDB file with the trace views over `data_dir`'s Parquet files. Returns its path.

    Raises ViewsFileError for an object-store URI or a directory that holds no trace store yet.
    """
    import duckdb

    from lightning_otel.collector.query import parquet_source, view_statements
    from lightning_otel.collector.store import Store
    from lightning_otel.collector.wal import fsync_path

    if "://" in str(data_dir):  # checked before Store(), which would contact the object store
        raise ViewsFileError(
            f"{data_dir}: only local trace stores are supported (Grafana's DuckDB would need S3 "
            "credentials of its own); sync the store to a local directory or use the built-in dashboard"
        )
    store = Store(data_dir)
    # Refuse rather than point views at an empty table: a file built that way would show nothing
    # forever, even after the collector starts writing. Once the collector has started, the store
    # holds spans/_schema.parquet (zero rows, full schema) and views over it answer with 0 rows.
    if not store.has_data():
        raise ViewsFileError(
            f"{store.root} holds no trace store yet (no Parquet files under {store.spans_root}); "
            "start the collector with this --data-dir first, then run grafana-views again"
        )
    source = parquet_source(store)

    out_path = Path(out).absolute()
    if out_path.is_dir():
        raise ViewsFileError(f"{out_path} is a directory; give the file to write, e.g. {out_path / 'views.duckdb'}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # Same directory as the target, so the rename is atomic; DuckDB may leave a .wal beside it.
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    tmp_wal = tmp.with_name(tmp.name + ".wal")
    _remove(tmp, tmp_wal)
    try:
        conn = duckdb.connect(str(tmp), config={"storage_compatibility_version": STORAGE_COMPATIBILITY})
        try:
            for statement in view_statements(source):
                conn.execute(statement)
            conn.execute("SELECT count(*) FROM spans").fetchone()  # fail here, not later in Grafana
            conn.execute("CHECKPOINT")  # everything in the main file: no .wal for Grafana to miss
        finally:
            conn.close()
        fsync_path(tmp)
        os.replace(tmp, out_path)
        fsync_path(out_path.parent)
    except duckdb.Error as exc:
        raise ViewsFileError(f"cannot build the views over {store.glob()}: {exc}") from exc
    finally:
        _remove(tmp, tmp_wal)
    return out_path


def _cmd_grafana_views(args: argparse.Namespace) -> int:
    try:
        path = write_views_file(args.data_dir, args.out)
    except ViewsFileError as exc:
        print(f"lightning-otel grafana-views: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {path}: trace views over {Path(args.data_dir).absolute()}; point Grafana's DuckDB datasource "
        f"at it read-only (docs/grafana.md)"
    )
    return 0


def add_parser(sub, data_dir: str) -> None:
    p = sub.add_parser("grafana-views", help="write a DuckDB file of the trace views for Grafana's DuckDB datasource")
    p.add_argument("--data-dir", default=data_dir, help="trace store, a local directory [$LIGHTNING_OTEL_DATA_DIR]")
    p.add_argument("--out", default="views.duckdb", help="the DuckDB file to write (replaced atomically)")
    p.set_defaults(func=_cmd_grafana_views)
