"""Turn a chain of LLM calls into training samples, merging calls only where exact.

The rule (pure, pinned by tests/trainer/test_merge.py): call k+1 joins the current sample exactly when
its prompt token ids start with call k's prompt + completion ids, the sequence the model saw and
produced. The tokens between (tool output, the next user turn, chat-template tokens) get loss
mask 0, the new completion mask 1. Otherwise the call starts a new sample, and the boundary
records where the two sequences first differ (retokenization.py says why). So a sample is always
a sequence the model actually saw, and only tokens the model generated carry loss.

Token ids are numpy arrays (views into the Arrow columns they were read from): the prefix test is
two array comparisons, and a sample is built once, from its last call, with no concatenation per
boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


def as_ids(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """int32 ids (a no-copy view when they already are): the merge compares raw bytes."""
    return np.asarray(values, dtype=np.int32)


@dataclass(frozen=True, eq=False)
class LLMCall:
    """One LLM call's token-level record (choice 0), from the `llm_calls` view."""

    span_id: str
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    logprobs: np.ndarray  # behaviour logprob of each completion id
    policy_version: str | None = None
    reconstructed: bool = False  # ids rebuilt from messages, not recorded from vLLM
    masked: np.ndarray | None = None  # completion tokens kept out of the loss (input_hygiene.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", as_ids(self.prompt_ids))
        object.__setattr__(self, "completion_ids", as_ids(self.completion_ids))
        object.__setattr__(self, "logprobs", np.asarray(self.logprobs, dtype=np.float64))
        if len(self.logprobs) != len(self.completion_ids):
            raise ValueError(
                f"call {self.span_id}: {len(self.logprobs)} logprobs for {len(self.completion_ids)} completion ids"
            )
        if self.masked is not None:
            object.__setattr__(self, "masked", np.asarray(self.masked, dtype=bool))
        if self.masked is not None and len(self.masked) != len(self.completion_ids):
            raise ValueError(
                f"call {self.span_id}: a mask of {len(self.masked)} for {len(self.completion_ids)} completion ids"
            )

    @property
    def sequence_length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


@dataclass
class Sample:
    """A token sequence to train on. `loss_mask[i]` is 1 iff the model generated token i;
    `behaviour_logprobs[i]` is its logprob under the policy that sampled it (0.0 where masked)."""

    token_ids: np.ndarray
    loss_mask: np.ndarray
    behaviour_logprobs: np.ndarray
    span_ids: list[str] = field(default_factory=list)
    policy_versions: list[str | None] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        return int(self.loss_mask.sum())


@dataclass(frozen=True)
class Boundary:
    """Between two consecutive calls of a chain: merged, or where the sequences first differ."""

    prev_span_id: str
    next_span_id: str
    merged: bool
    position: int | None = None  # first index where next prompt != prev prompt + completion


def first_divergence(prev: LLMCall, next_prompt: np.ndarray) -> int | None:
    """Index of the first token where next_prompt differs from prev's prompt + completion, or
    None when next_prompt starts with all of it (the merge condition)."""
    p = len(prev.prompt_ids)
    for start, part in ((0, prev.prompt_ids), (p, prev.completion_ids)):
        window = next_prompt[start : start + len(part)]
        # bytes equality is a memcmp: several times faster than numpy's elementwise ==, then .all()
        if len(window) < len(part) or window.tobytes() != part.tobytes():
            shared = min(len(window), len(part))
            different = np.flatnonzero(window[:shared] != part[:shared])
            return start + (int(different[0]) if len(different) else shared)
    return None


def extends(sample_tokens: Sequence[int], prompt_ids: Sequence[int]) -> bool:
    """True iff prompt_ids starts with sample_tokens (the exact-prefix merge condition)."""
    sample, prompt = as_ids(sample_tokens), as_ids(prompt_ids)
    return len(prompt) >= len(sample) and np.array_equal(prompt[: len(sample)], sample)


def _build(calls: list[LLMCall]) -> Sample:
    """The sample of a run of merged calls: the last call's prompt + completion, masks at each
    call's completion (each call's prompt is a prefix of the next, so positions are absolute)."""
    last = calls[-1]
    tokens = np.concatenate([last.prompt_ids, last.completion_ids])
    mask = np.zeros(len(tokens), dtype=np.int8)
    logprobs = np.zeros(len(tokens), dtype=np.float64)
    for call in calls:
        span = slice(len(call.prompt_ids), len(call.prompt_ids) + len(call.completion_ids))
        mask[span] = 1
        logprobs[span] = call.logprobs
        if call.masked is not None:  # unusable behaviour logprobs: no loss there (a finite 0.0 in their place)
            mask[span][call.masked] = 0
            logprobs[span][call.masked] = 0.0
    return Sample(tokens, mask, logprobs, [c.span_id for c in calls], [c.policy_version for c in calls])


def merge_calls(calls: Sequence[LLMCall]) -> tuple[list[Sample], list[Boundary]]:
    """Samples and boundaries for one chain of calls in causal order (see module docstring)."""
    runs: list[list[LLMCall]] = []
    boundaries: list[Boundary] = []
    for call in calls:
        if runs:
            prev = runs[-1][-1]
            position = first_divergence(prev, call.prompt_ids)
            boundaries.append(Boundary(prev.span_id, call.span_id, position is None, position))
            if position is None:
                runs[-1].append(call)
                continue
        runs.append([call])
    return [_build(run) for run in runs], boundaries
