"""`lightning-otel` command line: one entry point, one subcommand per part.

Each subcommand imports its part only when run, so the agent-side install can show `--help`
without the collector or trainer extras.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import signal
import sys
import threading


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _cmd_collector(args: argparse.Namespace) -> int:
    from lightning_otel.collector import Collector

    collector = Collector(args.data_dir, host=args.host, http_port=args.http_port, flush_interval_s=args.flush_interval)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    collector.start()
    print(f"lightning-otel collector: OTLP/HTTP {collector.http_endpoint}/v1/traces, data {args.data_dir}", flush=True)
    stop.wait()
    collector.stop()
    print("lightning-otel collector: stopped; all acknowledged spans are in Parquet", flush=True)
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
        result = conn.execute(args.query)
    except duckdb.Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    columns = [d[0] for d in result.description] if result.description else []
    _print_rows(columns, result.fetchall() if columns else [], args.format)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from lightning_otel.demo import run_demo

    return run_demo(workdir=args.workdir, iterations=args.iterations, tasks=args.tasks, rollouts_per_task=args.rollouts)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lightning-otel", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    data_dir = os.environ.get("LIGHTNING_OTEL_DATA_DIR", "./lightning-data")

    p = sub.add_parser("collector", help="run the OTLP collector (traces -> Parquet)")
    p.add_argument("--data-dir", default=data_dir, help="trace store directory [$LIGHTNING_OTEL_DATA_DIR]")
    p.add_argument("--host", default=os.environ.get("LIGHTNING_OTEL_HOST", "127.0.0.1"))
    p.add_argument("--http-port", type=int, default=_env_int("LIGHTNING_OTEL_HTTP_PORT", 4318))
    p.add_argument("--flush-interval", type=float, default=1.0, help="seconds between WAL -> Parquet flushes")
    p.set_defaults(func=_cmd_collector)

    p = sub.add_parser("sql", help="query the trace store with SQL (views: spans, llm_calls, rollouts, ...)")
    p.add_argument("--data-dir", default=data_dir)
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("query")
    p.set_defaults(func=_cmd_sql)

    p = sub.add_parser("demo", help="collector + vLLM + example agent + train + hot-swap, a few iterations")
    p.add_argument("--workdir", default="./demo-runs/latest")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--rollouts", type=int, default=4, help="rollouts per task (the GRPO group size)")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
