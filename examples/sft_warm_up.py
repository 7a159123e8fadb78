"""The examples' SFT warm-up: TRL's SFTTrainer on solved conversations, stopped by the example's
check at the first step that passes it. `training_loop` re-exports `sft_warmup`."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PROGRESS_EVERY_S = 10.0  # a progress line at most this often (lines, not a bar: they survive a pipe)


@dataclass(frozen=True)
class Check:
    """What a `stop_when` check may return instead of a bool: whether it passed, and a few words on
    the value it checked, which the progress lines show."""

    passed: bool
    summary: str = ""

    def __bool__(self) -> bool:
        return self.passed


def _progress_callback(steps: int, out):
    """A TrainerCallback printing one line to `out` at most every PROGRESS_EVERY_S: the step, the last
    logged loss, the last check's summary, seconds per step, and the time left if it runs to `steps`."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def __init__(self) -> None:
            self.began = self.printed = time.monotonic()
            self.loss: float | None = None
            self.check = ""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.loss = float(logs["loss"])

        def on_step_end(self, args, state, control, **kwargs):
            now = time.monotonic()
            if now - self.printed < PROGRESS_EVERY_S and state.global_step < steps:
                return
            self.printed = now
            per_step = (now - self.began) / max(state.global_step, 1)
            loss = f"loss {self.loss:.3f}" if self.loss is not None else "loss -"
            check = f", {self.check}" if self.check else ""
            left = (steps - state.global_step) * per_step / 60
            print(
                f"  warm-up step {state.global_step}/{steps}: {loss}{check}, {per_step:.2f} s/step,"
                f" at most {left:.0f} min left",
                file=out,
                flush=True,
            )

    return Progress()


def sft_warmup(
    base: Path,
    out: Path,
    examples: list[dict],
    tools: list[dict] | None,
    steps: int,
    learning_rate: float,
    seed: int,
    batch_size: int = 16,
    stop_when: Callable[[object, object], bool] | None = None,
    check_every: int = 5,
    weight_decay: float = 0.0,
) -> Path:
    """TRL's SFTTrainer on conversational prompt -> completion pairs (loss on the completion only),
    rendered with the model's chat template and `tools`; saves model and tokenizer to `out`.
    `stop_when(model, tokenizer)`, if given, is asked every `check_every` steps; once it returns True
    (or a passing `Check`) the warm-up ends with the weights of the first step that passes it (`steps`
    is then the most it runs). `out/warm_up.json` records the step kept and whether the check passed
    (`passed`; true when there is no check). Progress goes to stdout as
    lines (`_progress_callback`), also when stdout is a pipe."""
    import torch
    from datasets import Dataset, disable_progress_bars
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    class StopWhen(TrainerCallback):
        """Asks `stop_when` every `check_every` steps; when it holds, asks it again of the weights of
        each step since the last check (kept in memory, oldest first) and keeps the first that passes,
        so the warm-up ends at the first step where it holds, not at the first check."""

        def __init__(self) -> None:
            self.since_check: list[tuple[int, dict]] = []

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % check_every:
                self.since_check.append((state.global_step, copy.deepcopy(model.state_dict())))
                return
            candidates, self.since_check = self.since_check, []
            result = stop_when(model, tokenizer)
            if isinstance(result, Check) and result.summary:
                progress.check = f"check at {state.global_step}: {result.summary}"
            if not result:
                return
            control.should_training_stop = True
            latest = copy.deepcopy(model.state_dict())
            for step, weights in candidates:
                model.load_state_dict(weights)
                if stop_when(model, tokenizer):
                    self.stopped_at = step
                    return
            model.load_state_dict(latest)
            self.stopped_at = state.global_step

    disable_progress_bars()
    progress = _progress_callback(steps, sys.stdout)  # this stdout: TRL's own prints are swallowed below
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    rows = [{**example, "tools": json.dumps(tools)} if tools else example for example in examples]
    stopper = StopWhen() if stop_when else None
    args = SFTConfig(
        output_dir=str(out / "sft-checkpoints"),
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        weight_decay=weight_decay,
        lr_scheduler_type="constant",
        logging_strategy="steps",  # the loss for the progress lines
        logging_steps=5,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        bf16=False,  # TRL's defaults (bf16, gradient checkpointing) only slow a tiny float32 model on CPU
        gradient_checkpointing=False,
        max_length=None,  # TRL's 1024 drops a harness's long conversations (coding's run ~1,500 tokens)
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[stopper, progress] if stopper else [progress],  # a check step's line shows that check
    )
    with contextlib.redirect_stdout(io.StringIO()):  # TRL prints its metrics dict; the table is the output
        trainer.train()
    trainer.save_model(str(out))
    tokenizer.save_pretrained(out)
    stopped_at = getattr(stopper, "stopped_at", trainer.state.global_step)
    passed = stopper is None or hasattr(stopper, "stopped_at")
    (out / "warm_up.json").write_text(json.dumps({"steps": stopped_at, "max_steps": steps, "passed": passed}))
    return out
