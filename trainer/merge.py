"""Turn a rollout's ordered LLM calls into training samples, merging calls only where exact.

The rule (pure, pinned by tests/test_merge.py): call k+1 joins the current sample exactly when
its prompt token ids start with the sample's tokens so far (every earlier prompt and
completion, as the model saw and produced them). The tokens between (tool output, the next
user turn, chat-template tokens) are appended with loss mask 0; the new completion with mask 1.
Otherwise the call starts a new sample. So a sample is always a sequence the model actually
saw, and only tokens the model generated carry loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass(frozen=True)
class LLMCall:
    """One LLM call's token-level record (choice 0), from the `llm_calls` view."""

    span_id: str
    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    logprobs: Sequence[float]  # behaviour logprob of each completion id
    policy_version: str | None = None

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.completion_ids):
            raise ValueError(
                f"call {self.span_id}: {len(self.logprobs)} logprobs for {len(self.completion_ids)} completion ids"
            )


@dataclass
class Sample:
    """A token sequence to train on. `loss_mask[i]` is 1 iff the model generated token i;
    `behaviour_logprobs[i]` is its logprob under the policy that sampled it (0.0 where masked)."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    behaviour_logprobs: list[float] = field(default_factory=list)
    span_ids: list[str] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    def _extend(self, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None = None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([mask] * len(ids))
        self.behaviour_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    def append_call(self, call: LLMCall) -> None:
        """Append `call`, whose prompt must start with this sample's tokens."""
        self._extend(call.prompt_ids[len(self.token_ids) :], 0)
        self._extend(call.completion_ids, 1, call.logprobs)
        self.span_ids.append(call.span_id)


def extends(sample_tokens: Sequence[int], prompt_ids: Sequence[int]) -> bool:
    """True iff prompt_ids starts with sample_tokens (the exact-prefix merge condition)."""
    n = len(sample_tokens)
    return len(prompt_ids) >= n and list(prompt_ids[:n]) == list(sample_tokens)


def merge_calls(calls: Sequence[LLMCall]) -> list[Sample]:
    """Samples for one chain of calls in causal order (see module docstring)."""
    samples: list[Sample] = []
    for call in calls:
        if not samples or not extends(samples[-1].token_ids, call.prompt_ids):
            samples.append(Sample())
        samples[-1].append_call(call)
    return samples
