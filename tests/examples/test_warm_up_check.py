"""The tool_use warm-up's copy check (`run.copy_probabilities`), which runs its conversations in padded
batches, gives what one conversation at a time gives: the reference below runs each conversation
alone, unpadded, and reads the probability of each copied digit from the full softmax."""

from __future__ import annotations

import random
import sys

import pytest
from repo_paths import EXAMPLES

TOOL_USE = EXAMPLES / "tool_use"
sys.path[:0] = [str(TOOL_USE), str(TOOL_USE.parent)]
import calculator_task  # noqa: E402
import run as tool_use  # noqa: E402


def _one_at_a_time(model, tokenizer, tasks) -> list[float]:
    import torch

    tools = [calculator_task.tool_schema()]
    digit_ids = {tokenizer.convert_tokens_to_ids(d) for d in "0123456789"}
    sums = [0.0] * 8
    for question, result in tasks:
        for which, pair in enumerate(calculator_task.solved_conversation(question, result)):
            prompt = tokenizer.apply_chat_template(
                pair["prompt"], tools=tools, tokenize=False, add_generation_prompt=True
            )
            full = tokenizer.apply_chat_template(pair["prompt"] + pair["completion"], tools=tools, tokenize=False)
            prompt_ids, full_ids = tokenizer.encode(prompt), tokenizer.encode(full)
            with torch.no_grad():
                probabilities = torch.softmax(model(torch.tensor([full_ids])).logits[0].double(), dim=-1)
            copied = [t for t in range(len(prompt_ids), len(full_ids)) if full_ids[t] in digit_ids][:4]
            assert len(copied) == 4  # four-digit operands... and the first four of the answer's digits
            for k, t in enumerate(copied):
                sums[4 * which + k] += probabilities[t - 1, full_ids[t]].item()
    return [total / len(tasks) for total in sums]


@pytest.fixture(scope="module")
def tasks():
    rng = random.Random(5)
    return [calculator_task.make_task(rng, "warm_up_check") for _ in range(7)]  # batches of 3: one part-filled


@pytest.fixture(scope="module")
def fitted_model(tmp_path_factory, tasks):
    """The example's tiny model fitted a little to `tasks`' conversations: copied digits at probabilities
    well away from 0 and from each other (an untrained model gives every digit ~1/1024)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = tool_use.build_model(tmp_path_factory.mktemp("tool-use") / "base", seed=2)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    tools = [calculator_task.tool_schema()]
    texts = [
        tokenizer.apply_chat_template(pair["prompt"] + pair["completion"], tools=tools, tokenize=False)
        for question, result in tasks
        for pair in calculator_task.solved_conversation(question, result)
    ]
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(60):
        ids = torch.tensor([tokenizer.encode(texts[step % len(texts)])])
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, tokenizer


def test_batched_copy_check_equals_one_conversation_at_a_time(fitted_model, tasks):
    model, tokenizer = fitted_model
    batched = tool_use.copy_probabilities(model, tokenizer, tasks, batch_size=3)
    reference = _one_at_a_time(model, tokenizer, tasks)
    assert len(batched) == 8
    assert max(abs(a - b) for a, b in zip(batched, reference)) < 1e-5, (batched, reference)
    assert max(reference) > 0.05 and max(reference) > 2 * min(reference)  # far from uniform, and unlike each other
