"""The examples' SFT warm-up (`examples/sft_warm_up.py`) ends at the first step whose weights
pass its check, not at the first check: a check that passes every model must leave the weights of a
one-step run, whatever the checks' spacing; one that never passes runs every step."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from repo_paths import EXAMPLES
from safetensors.torch import load_file

from lightning_otel.testing.tiny_model import build_tiny_model

sys.path.insert(0, str(EXAMPLES))
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


def test_the_warm_up_prints_progress_lines_with_the_checks_value_when_piped(tmp_path, monkeypatch, capsys):
    import sft_warm_up

    monkeypatch.setattr(sft_warm_up, "PROGRESS_EVERY_S", 0.0)  # a line every step
    base = build_tiny_model(tmp_path / "base")
    checks = iter(range(100))
    training_loop.sft_warmup(
        base,
        tmp_path / "out",
        _examples(),
        None,
        8,
        2e-3,
        seed=0,
        stop_when=lambda model, _: training_loop.Check(False, f"value {next(checks)}"),
        check_every=4,
    )
    lines = [line for line in capsys.readouterr().out.splitlines() if "warm-up step" in line]
    assert [line.split("warm-up step ")[1].split(":")[0] for line in lines] == [f"{k}/8" for k in range(1, 9)]
    assert "check at 4: value 0" in lines[3] and "check at 8: value 1" in lines[-1]
    assert all("loss " in line and "s/step" in line and "min left" in line for line in lines)
    assert any("loss -" not in line for line in lines)  # the logged loss reaches the line


def test_a_rerun_resumes_unless_fresh_and_fresh_deletes_only_what_a_run_leaves(tmp_path, capsys):
    workdir = tmp_path / "run"
    training_loop.open_workdir(workdir, fresh=False)
    assert "starting in" in capsys.readouterr().out
    (workdir / "traces").mkdir()
    (workdir / "vllm.log").write_text("x")
    (workdir / "notes.txt").write_text("the user's own file")
    training_loop.open_workdir(workdir, fresh=False)
    assert "resuming in" in capsys.readouterr().out and (workdir / "traces").exists()
    training_loop.open_workdir(workdir, fresh=True)
    assert "starting fresh" in capsys.readouterr().out
    assert sorted(p.name for p in workdir.iterdir()) == ["notes.txt"]
