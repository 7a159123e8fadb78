"""`lightning-otel train` with a fault at a named point, for test_training_job.py: the process dies as a
kill would (os._exit(86)) as a stage of the run ends, or the checkpoint just committed is corrupted
(loadable, wrong weights) before the swap. A real kill at an exact point is not otherwise
reproducible; the run itself is the CLI's, untouched.

    python tests/train_with_fault.py after_checkpoint --config train.toml --json
"""

import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lightning_otel.cli import build_parser
from lightning_otel.trainer.command import train
from lightning_otel.trainer.config import load_config

CRASH_AFTER = {
    "after_load": "select rollouts",
    "mid_step": "update",
    "after_checkpoint": "checkpoint",
    "after_swap": "swap + probe",
}


def corrupt_latest(state_dir: Path) -> None:
    checkpoint = max((state_dir / "checkpoints").glob("step-*"))
    for path in (checkpoint / "model").glob("*.safetensors"):
        tensors = {name: tensor + 0.5 * torch.randn_like(tensor) for name, tensor in load_file(str(path)).items()}
        save_file(tensors, str(path), metadata={"format": "pt"})


def main() -> int:
    fault, argv = sys.argv[1], sys.argv[2:]
    args = build_parser().parse_args(["train", *argv])
    state_dir = Path(load_config(args.config).checkpoints.dir)

    def on_stage(name: str) -> None:
        if fault == "corrupt_checkpoint" and name == "checkpoint":
            corrupt_latest(state_dir)
        elif CRASH_AFTER.get(fault) == name:
            os._exit(86)

    return train(args, on_stage=on_stage)


if __name__ == "__main__":
    sys.exit(main())
