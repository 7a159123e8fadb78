"""Why did two consecutive calls not merge? Classify each failed boundary.

Let S = previous prompt + previous completion (what the model saw and produced), N = the next
prompt, d = the first index where they differ (merge.first_divergence). Causes, in the order tried:

  context_rewritten      N is shorter than S up to d, or d falls in the previous prompt past its
                         first message: history was summarized, truncated or edited.
  system_prompt_changed  d falls in the previous prompt's first message: another (sub-)agent or a
                         new system prompt.
  retokenized            d falls in the previous completion and the next prompt holds the same
                         text there, tokenized differently (detokenize -> retokenize is not the
                         identity: the paper's main cause), or the text came back with U+FFFD for
                         bytes that were not valid UTF-8.
  template_changed       d falls in the previous completion (or right after it) and the text
                         differs only in chat-template material: special tokens, a reasoning block
                         (<think>...</think>) dropped from history, whitespace the template trims.
  completion_rewritten   d falls in the previous completion and its text was changed otherwise.

Needs the tokenizer for the text-level causes; without one, d in the completion is `unknown`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from lightning_otel.trainer.merge import LLMCall

CAUSES = (
    "context_rewritten",
    "system_prompt_changed",
    "retokenized",
    "template_changed",
    "completion_rewritten",
    "unknown",
)
_REASONING = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


@dataclass(frozen=True)
class Diagnosis:
    cause: str
    position: int  # first divergent token index
    region: str  # "prompt", "first_message", "completion", "after_completion"
    detail: str = ""


def _message_starts(ids: np.ndarray, start_id: int | None) -> np.ndarray:
    return np.flatnonzero(ids == start_id) if start_id is not None else np.array([], dtype=np.int64)


def classify(prev: LLMCall, next_prompt: np.ndarray, position: int, tokenizer=None) -> Diagnosis:
    """The cause of a failed boundary at `position` (see module docstring)."""
    p, c = len(prev.prompt_ids), len(prev.completion_ids)
    if position >= len(next_prompt) and position < p + c:
        return Diagnosis(
            "context_rewritten",
            position,
            "prompt" if position < p else "completion",
            f"next prompt ({len(next_prompt)} tokens) ends inside the previous sequence ({p + c})",
        )
    start_id = _role_start_id(tokenizer)
    if position < p:
        starts = _message_starts(prev.prompt_ids, start_id)
        second_message = int(starts[1]) if len(starts) > 1 else None
        if second_message is not None and position < second_message:
            return Diagnosis("system_prompt_changed", position, "first_message")
        return Diagnosis("context_rewritten", position, "prompt")
    region = "completion" if position < p + c else "after_completion"
    if tokenizer is None:
        return Diagnosis("unknown", position, region, "no tokenizer to compare text")
    return _compare_completion_text(prev, next_prompt, tokenizer, position, region)


def _role_start_id(tokenizer) -> int | None:
    """The token that opens a chat message (ChatML's <|im_start|>), if the tokenizer has one."""
    if tokenizer is None:
        return None
    for token in ("<|im_start|>", "<|start_header_id|>", "<start_of_turn>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            return token_id
    return None


def _compare_completion_text(
    prev: LLMCall, next_prompt: np.ndarray, tokenizer, position: int, region: str
) -> Diagnosis:
    p = len(prev.prompt_ids)
    special = set(tokenizer.all_special_ids)
    # The previous completion as the model produced it, and the stretch of the next prompt that
    # replaced it: from the end of the previous prompt up to the next special token.
    produced = [t for t in prev.completion_ids.tolist() if t not in special]
    end = p
    while end < len(next_prompt) and int(next_prompt[end]) not in special:
        end += 1
    rendered = next_prompt[p:end].tolist()
    produced_text = tokenizer.decode(produced)
    rendered_text = tokenizer.decode(rendered)
    if "\ufffd" in produced_text or "\ufffd" in rendered_text:
        # vLLM detokenizes incrementally; bytes that are not valid UTF-8 come back as U+FFFD, and
        # the next prompt re-encodes that character, not the bytes: a lossy retokenization.
        return Diagnosis(
            "retokenized", position, region, "bytes that are not valid UTF-8 were replaced when detokenized"
        )
    if produced_text == rendered_text:
        if produced != rendered:
            return Diagnosis("retokenized", position, region, f"same text, {len(produced)} ids became {len(rendered)}")
        return Diagnosis("template_changed", position, region, "same completion; special tokens after it differ")
    if _REASONING.search(produced_text) and _REASONING.sub("", produced_text).strip() == rendered_text.strip():
        return Diagnosis("template_changed", position, region, "reasoning block dropped from history")
    if produced_text.strip() == rendered_text.strip():
        return Diagnosis("template_changed", position, region, "whitespace trimmed by the template")
    return Diagnosis("completion_rewritten", position, region, "the previous completion's text was changed")
