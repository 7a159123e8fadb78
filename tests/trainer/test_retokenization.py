"""Each cause of a failed merge, produced with the real tiny-model tokenizer and chat template, and
detected and classified. Harness behaviours are simulated on token ids, which is exactly what the
trainer sees: what vLLM returned for one call and the prompt ids of the next."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from lightning_otel.trainer.merge import LLMCall, merge_calls
from lightning_otel.trainer.retokenization import classify


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def render(tokenizer, messages, generation_prompt=True):
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _call(name, prompt, completion):
    return LLMCall(name, prompt, completion, np.full(len(completion), -0.5))


SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER = {"role": "user", "content": "fix the failing test"}


def _boundary(tokenizer, completion_ids, next_messages):
    """What the harness does: the model answered completion_ids; the next prompt renders next_messages."""
    first = _call("first", render(tokenizer, [SYSTEM, USER]), completion_ids)
    second = _call("second", render(tokenizer, next_messages), [tokenizer.eos_token_id])
    samples, [boundary] = merge_calls([first, second])
    if boundary.merged:
        return samples, None
    return samples, classify(first, second.prompt_ids, boundary.position, tokenizer)


def _canonical(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


def test_an_exact_continuation_merges(tokenizer):
    answer = " apple banana"
    samples, diagnosis = _boundary(
        tokenizer,
        _canonical(tokenizer, answer),
        [SYSTEM, USER, {"role": "assistant", "content": answer}, {"role": "tool", "content": "ok"}],
    )
    assert diagnosis is None and len(samples) == 1


def test_retokenized_completion(tokenizer):
    answer = " apple banana"
    # the model emitted " apple" as single-character tokens: same text, other ids
    spelled = [tokenizer.convert_tokens_to_ids(ch) for ch in ["Ġ", "a", "p", "p", "l", "e"]]
    completion = spelled + tokenizer.encode(" banana", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert tokenizer.decode(completion, skip_special_tokens=True) == answer
    samples, diagnosis = _boundary(
        tokenizer,
        completion,
        [SYSTEM, USER, {"role": "assistant", "content": answer}, {"role": "tool", "content": "ok"}],
    )
    assert len(samples) == 2
    assert diagnosis.cause == "retokenized" and diagnosis.region == "completion"
    assert diagnosis.position == len(render(tokenizer, [SYSTEM, USER]))  # the first token of the completion


def test_reasoning_block_dropped_by_the_template(tokenizer):
    completion = _canonical(tokenizer, "<think>check the number</think> answer 42")
    _, diagnosis = _boundary(
        tokenizer,
        completion,
        [SYSTEM, USER, {"role": "assistant", "content": "answer 42"}, {"role": "tool", "content": "ok"}],
    )
    assert diagnosis.cause == "template_changed" and "reasoning" in diagnosis.detail


def test_whitespace_trimmed_by_the_template(tokenizer):
    completion = _canonical(tokenizer, "answer 42\n\n")
    _, diagnosis = _boundary(
        tokenizer,
        completion,
        [SYSTEM, USER, {"role": "assistant", "content": "answer 42"}, {"role": "tool", "content": "ok"}],
    )
    assert diagnosis.cause == "template_changed" and "whitespace" in diagnosis.detail


def test_context_rewritten_by_summarization(tokenizer):
    completion = _canonical(tokenizer, " apple")
    summary = {"role": "user", "content": "summary: the test was fixed"}
    _, diagnosis = _boundary(tokenizer, completion, [SYSTEM, summary, {"role": "user", "content": "next step"}])
    assert diagnosis.cause == "context_rewritten" and diagnosis.region == "prompt"


def test_context_truncated(tokenizer):
    prompt = render(tokenizer, [SYSTEM, USER])
    first = _call("first", prompt, _canonical(tokenizer, " apple"))
    truncated = np.asarray(prompt[: len(prompt) // 2])
    [_, _], [boundary] = merge_calls([first, _call("second", truncated, [1])])
    diagnosis = classify(first, truncated, boundary.position, tokenizer)
    assert diagnosis.cause == "context_rewritten" and "ends inside" in diagnosis.detail


def test_another_agent_or_system_prompt(tokenizer):
    completion = _canonical(tokenizer, " apple")
    sub_agent = {"role": "system", "content": "You are a test-writing sub-agent."}
    _, diagnosis = _boundary(tokenizer, completion, [sub_agent, USER, {"role": "assistant", "content": " apple"}])
    assert diagnosis.cause == "system_prompt_changed" and diagnosis.region == "first_message"


def test_completion_rewritten_by_the_harness(tokenizer):
    completion = _canonical(tokenizer, " apple banana")
    _, diagnosis = _boundary(
        tokenizer,
        completion,
        [SYSTEM, USER, {"role": "assistant", "content": " cherry"}, {"role": "tool", "content": "ok"}],
    )
    assert diagnosis.cause == "completion_rewritten"


def test_without_a_tokenizer_positions_still_classify_the_prompt_side(tokenizer):
    prompt = render(tokenizer, [SYSTEM, USER])
    first = _call("first", prompt, _canonical(tokenizer, " apple"))
    edited = np.asarray([prompt[0] + 1] + prompt[1:])
    assert classify(first, edited, 0, None).cause == "context_rewritten"  # no message starts known
    assert classify(first, np.asarray(prompt + [9, 9, 9, 9]), len(prompt), None).cause == "unknown"


def test_invalid_utf8_replaced_on_detokenization_is_a_retokenization(tokenizer):
    from tokenizers.pre_tokenizers import ByteLevel  # noqa: F401 - the byte<->char table below is ByteLevel's

    stray = tokenizer.convert_tokens_to_ids("Ģ")  # ByteLevel's char for the lone byte 0x80: not valid UTF-8
    completion = tokenizer.encode(" apple", add_special_tokens=False) + [stray, tokenizer.eos_token_id]
    text = tokenizer.decode(completion, skip_special_tokens=True)
    assert text.endswith("\ufffd")  # what vLLM hands the harness
    _, diagnosis = _boundary(
        tokenizer, completion, [SYSTEM, USER, {"role": "assistant", "content": text}, {"role": "tool", "content": "ok"}]
    )
    assert diagnosis.cause == "retokenized" and "UTF-8" in diagnosis.detail
