"""The examples' SFT warm-up (`examples/sft_warm_up.py`) ends at the first step whose weights
pass its check, not at the first check: a check that passes every model must leave the weights of a
one-step run, whatever the checks' spacing; one that never passes runs every step."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from lightning_otel.trainer.tiny_model import build_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import training_loop


def _examples() -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"{a} + {a}"}],
            "completion": [{"role": "assistant", "content": str(2 * a)}],
        }
        for a in range(48)
    ]


def _warm_up(base: Path, out: Path, steps: int, stop_when=None) -> tuple[int, dict[str, torch.Tensor]]:
    training_loop.sft_warmup(base, out, _examples(), None, steps, 2e-3, seed=0, stop_when=stop_when, check_every=4)
    return json.loads((out / "warm_up.json").read_text())["steps"], load_file(out / "model.safetensors")


def test_the_warm_up_ends_at_the_first_step_that_passes_its_check(tmp_path):
    base = build_tiny_model(tmp_path / "base")
    _, one_step = _warm_up(base, tmp_path / "one", steps=1)
    asked = []
    steps, stopped = _warm_up(base, tmp_path / "stopped", steps=12, stop_when=lambda model, _: asked.append(1) or True)
    assert steps == 1
    assert len(asked) == 2  # the check at step 4, then step 1's weights
    assert stopped.keys() == one_step.keys()
    for name, weight in one_step.items():
        torch.testing.assert_close(stopped[name], weight, rtol=0, atol=0, msg=name)

    steps, _ = _warm_up(base, tmp_path / "never", steps=6, stop_when=lambda model, _: False)
    assert steps == 6
