"""`lightning-otel train`: one scheduled training run. Imports only the standard library and the
settings at load time, so `--help` works without torch."""

from __future__ import annotations

import argparse
import json
import os
import sys

from lightning_otel.trainer.config import add_flags


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="one scheduled training run: select, update, checkpoint, swap, exit")
    add_flags(p)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line, without progress output")
    p.set_defaults(func=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    from lightning_otel.trainer.config import load_config
    from lightning_otel.trainer.checkpoints import JobFailed, LockHeld
    from lightning_otel.trainer.training_run import run_once

    overrides = {k: v for k, v in vars(args).items() if "." in k}
    try:
        summary = run_once(load_config(args.config, overrides), progress=not args.json)
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
                    "stage_seconds": summary.stage_seconds,
                }
            )
        )
    else:
        print(summary.table())
    return 0
