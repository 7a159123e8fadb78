"""What one run of the scheduled job reports (RunSummary: the table printed at the end, or the JSON
line of `lightning-otel train --json`), and the timing of its stages (training_run.py)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class RunSummary:
    status: str  # "trained", "nothing to do", "skipped: non-finite gradient", "skipped: no trainable token"
    step: int | None = None
    version: str | None = None
    rollouts: int = 0
    samples: int = 0
    mean_reward: float | None = None
    loss: float | None = None
    swap_seconds: float | None = None
    samples_histogram: list[int] = field(default_factory=list)  # element k: rollouts that became k + 1 samples
    excluded: dict[str, str] = field(default_factory=dict)
    eval_rollouts: int = 0  # evaluation rollouts in the run's window, never trained on (not excluded: not candidates)
    at_fault: list[str] = field(default_factory=list)  # rollouts with a non-finite gradient, now excluded for good
    stage_seconds: dict[str, float] = field(default_factory=dict)

    def table(self) -> str:
        """The human-readable summary printed at the end of a run."""
        rows = [
            ("status", self.status),
            ("step / version", f"{self.step} / {self.version}"),
            ("rollouts used", self.rollouts),
            ("samples", self.samples),
            ("mean reward", _fmt(self.mean_reward)),
            ("loss", _fmt(self.loss)),
            ("swap seconds", _fmt(self.swap_seconds)),
            ("rollouts excluded", len(self.excluded)),
            ("eval rollouts", f"{self.eval_rollouts} (never trained on)"),
        ]
        if self.at_fault:
            rows.append(
                ("rollouts at fault", ", ".join(self.at_fault[:5]) + (" ..." if len(self.at_fault) > 5 else ""))
            )
        rows += [(f"  {stage} s", f"{seconds:.2f}") for stage, seconds in self.stage_seconds.items()]
        return "\n".join(f"{name:<20} {value}" for name, value in rows)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


class Stages:
    """Times each stage into the summary; with progress on, says what runs now on stderr; calls
    `on_stage(name)` as a stage ends."""

    def __init__(self, summary: RunSummary, progress: bool, on_stage: Callable[[str], None] | None) -> None:
        self.summary, self.progress, self.on_stage = summary, progress, on_stage

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.progress:
            print(f"lightning-otel train: {name} ...", file=sys.stderr, flush=True)
        began = time.perf_counter()
        yield
        self.summary.stage_seconds[name] = round(time.perf_counter() - began, 3)
        if self.on_stage is not None:
            self.on_stage(name)
