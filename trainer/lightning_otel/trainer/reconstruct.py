"""Rebuild token ids for an LLM call that has none (a provider other than vLLM), from the messages
OpenInference recorded, with the model's chat template. Such a call is marked `reconstructed` and
only trained on when the selection allows it: the ids are a guess at what the model would have seen
(the provider's own template and tokenizer may differ), and there are no behaviour logprobs (NaN;
the update uses the current policy's, so its first ratio is 1).
"""

from __future__ import annotations

import numpy as np

from lightning_otel.core import schema
from lightning_otel.trainer.merge import LLMCall

_OUTPUT = schema.message_attribute(schema.LLM_OUTPUT_MESSAGES, 0, schema.MESSAGE_CONTENT)


def _input(index: int, field: str) -> str:
    return schema.message_attribute(schema.LLM_INPUT_MESSAGES, index, field)


def recorded_messages(attributes: dict) -> list[dict]:
    messages, index = [], 0
    while _input(index, schema.MESSAGE_ROLE) in attributes:
        messages.append(
            {
                "role": attributes[_input(index, schema.MESSAGE_ROLE)],
                "content": attributes.get(_input(index, schema.MESSAGE_CONTENT), ""),
            }
        )
        index += 1
    return messages


def reconstruct_call(span_id: str, attributes: dict, tokenizer, policy_version: str | None = None) -> LLMCall | None:
    """The call rebuilt from its recorded messages, or None when they were not recorded (or redacted)."""
    messages = recorded_messages(attributes)
    output = attributes.get(_OUTPUT)
    if not messages or output is None or output == schema.REDACTED:
        return None
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    completion = tokenizer.encode(output, add_special_tokens=False)
    if tokenizer.eos_token_id is not None and attributes.get(schema.FINISH_REASON, "stop") == "stop":
        completion.append(tokenizer.eos_token_id)  # a chat model ends its turn with EOS
    return LLMCall(span_id, prompt, completion, np.full(len(completion), np.nan), policy_version, reconstructed=True)
