"""`lightning-otel collector` and `lightning-otel sql`. Imports only the standard library and the
settings at load time, so `--help` works without the collector's extras."""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import signal
import sys
import threading

from lightning_otel.collector.config import CollectorConfig
from lightning_otel.core.flags import add_flags, from_args


def add_collector_parser(sub: argparse._SubParsersAction, data_dir: str) -> None:
    """The `collector` subcommand (a `lightning_otel.commands` entry point). Its --data-dir is
    CollectorConfig's setting, with the config's own default and environment variable."""
    p = sub.add_parser(
        "collector",
        help="run the OTLP collector (traces -> Parquet)",
        description=(
            "Receives spans over OTLP/HTTP (POST /v1/traces on --http-port, default 4318) and OTLP/gRPC (--grpc-port,"
            " default 4317) and stores them as Parquet under --data-dir; sends no spans of its own. Exporters reach it"
            " at http://HOST:HTTP_PORT/v1/traces: the default of instrument(), the gateway and train."
        ),
    )
    add_flags(p, CollectorConfig)
    p.set_defaults(func=_cmd_collector)


def add_sql_parser(sub: argparse._SubParsersAction, data_dir: str) -> None:
    """The `sql` subcommand (entry point `lightning_otel.commands`)."""
    p = sub.add_parser("sql", help="query the trace store with SQL (views: spans, llm_calls, rollouts, ...)")
    p.add_argument("--data-dir", default=data_dir, help="trace store [$LIGHTNING_OTEL_DATA_DIR]")
    p.add_argument("--format", choices=("table", "csv", "json", "parquet"), default="table")
    p.add_argument("--output", help="write to this file (required for parquet)")
    p.add_argument("query")
    p.set_defaults(func=_cmd_sql)


def _cmd_collector(args: argparse.Namespace) -> int:
    from lightning_otel.collector import Collector, CollectorConfig

    collector = Collector(from_args(CollectorConfig, args))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    collector.start()
    where = []
    if collector.http is not None:
        where.append(f"OTLP/HTTP {collector.http_endpoint}/v1/traces")
    if collector.grpc is not None:
        where.append(f"OTLP/gRPC {args.host}:{collector.grpc_port}")
    print(f"lightning-otel collector: {', '.join(where) or 'no receiver'}; data {args.data_dir}", flush=True)
    stop.wait()
    collector.stop()
    print(f"lightning-otel collector: stopped; {collector.conversion_report()}", flush=True)
    return 0


def _print_rows(columns: list[str], rows: list[tuple], fmt: str) -> None:
    if fmt == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows(rows)
    elif fmt == "json":
        for row in rows:
            print(json.dumps(dict(zip(columns, row)), default=str))
    else:
        print(format_table(columns, rows))


def format_table(columns: list[str], rows: list[tuple], max_width: int = 60) -> str:
    """A plain text table; long cells are cut with '…'."""

    def cell(value: object) -> str:
        text = "NULL" if value is None else str(value)
        return text if len(text) <= max_width else text[: max_width - 1] + "…"

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(columns, widths)), "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines)


def _cmd_sql(args: argparse.Namespace) -> int:
    import duckdb

    from lightning_otel.collector import connect

    conn = connect(args.data_dir)
    try:
        if args.format == "parquet":
            if not args.output:
                print("error: --format parquet needs --output FILE", file=sys.stderr)
                return 2
            conn.sql(args.query).write_parquet(args.output, compression="zstd")
            return 0
        result = conn.execute(args.query)
    except duckdb.Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    columns = [d[0] for d in result.description] if result.description else []
    rows = result.fetchall() if columns else []
    if args.output:
        with open(args.output, "w", newline="") as handle, contextlib.redirect_stdout(handle):
            _print_rows(columns, rows, args.format)
    else:
        _print_rows(columns, rows, args.format)
    return 0
