"""`lightning-otel train`: one scheduled training run. Imports only the standard library and the
settings at load time, so `--help` works without torch."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from lightning_otel.core.otlp import SPANS_DESTINATION, traces_endpoint
from lightning_otel.trainer.config import add_flags


def add_parser(sub: argparse._SubParsersAction, data_dir: str = "") -> None:
    # data_dir: the signature every `lightning_otel.commands` entry point shares (cli.py); the store comes from the run's config
    p = sub.add_parser(
        "train",
        help="one scheduled training run: select, update, checkpoint, swap, exit",
        description=(
            f"Sends a train_step span and the merge diagnostics of each run over OTLP/HTTP to {SPANS_DESTINATION};"
            " --otlp-endpoint is [store] otlp_endpoint."
        ),
    )
    add_flags(p)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line, without progress output")
    p.set_defaults(func=train)


def train(args: argparse.Namespace, on_stage: Callable[[str], None] | None = None) -> int:
    """Run it; exit status 0 done or nothing to do, 1 failed, 3 another run holds the lock.
    `on_stage(name)` is called as each stage of the run ends (training_run.run_once)."""
    from lightning_otel.trainer.config import load_config

    overrides = {k: v for k, v in vars(args).items() if "." in k}
    config = load_config(args.config, overrides)
    if os.environ.get("RANK", "0") == "0":  # before torch's imports: said at once
        print(
            f"lightning-otel train: spans -> {traces_endpoint(config.store.otlp_endpoint)}", file=sys.stderr, flush=True
        )
    from lightning_otel.trainer.checkpoints import JobFailed, LockHeld
    from lightning_otel.trainer.training_run import run_once

    try:
        summary = run_once(config, progress=not args.json, on_stage=on_stage)
    except LockHeld as exc:
        print(f"lightning-otel train: {exc}", file=sys.stderr)
        return 3
    except JobFailed as exc:
        print(f"lightning-otel train: failed: {exc}", file=sys.stderr)
        return 1
    if os.environ.get("RANK", "0") != "0":
        return 0  # torchrun: rank 0 reports
    if args.json:
        print(
            json.dumps(
                {
                    "status": summary.status,
                    "step": summary.step,
                    "version": summary.version,
                    "rollouts": summary.rollouts,
                    "samples": summary.samples,
                    "mean_reward": summary.mean_reward,
                    "loss": summary.loss,
                    "swap_seconds": summary.swap_seconds,
                    "excluded": len(summary.excluded),
                    "at_fault": summary.at_fault,
                    "stage_seconds": summary.stage_seconds,
                }
            )
        )
    else:
        print(summary.table())
    return 0
