"""A task whose reward is checkable, for the learning test, the ablation and the demo.

Task: "What is a + b?" for digits a, b; the reply must read "The answer is <a+b>." exactly.
Reward: 1 for the right sum in that format, 0.25 for the format with a wrong number, 0 otherwise.
Held-out tasks (16 pairs, closed under swapping a and b) are never trained on, so a rising held-out reward is learning,
not memorizing. `sft_warmup` teaches a little of the format with TRL's SFTTrainer; `LocalSampler`
samples from a transformers model in process (with exact behaviour logprobs) for fast CPU loops
that need no vLLM server.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PAIRS = [(a, b) for a in range(10) for b in range(10)]
# Symmetric in a and b, so "b + a" of a held-out "a + b" is held out too (the same question mirrored),
# and every held-out sum is also the sum of some training pair: 16 pairs
HELD_OUT = [(a, b) for a, b in PAIRS if (a * b + 1) % 5 == 0]
TRAIN = [p for p in PAIRS if p not in HELD_OUT]
_FORMAT = re.compile(r"^\s*The answer is (\d+)\.?\s*$")


def messages(a: int, b: int) -> list[dict]:
    return [{"role": "user", "content": f"What is {a} + {b}?"}]


def answer(a: int, b: int) -> str:
    return f"The answer is {a + b}."


def formatted(text: str) -> bool:
    return _FORMAT.match(text) is not None


def reward(text: str, a: int, b: int) -> float:
    match = _FORMAT.match(text)
    if match is None:
        return 0.0
    return 1.0 if int(match.group(1)) == a + b else 0.25


def sft_warmup(
    model_dir: str | Path, out_dir: str | Path, steps: int = 40, learning_rate: float = 2e-3, seed: int = 0
) -> Path:
    """A short supervised warm-up on the training pairs with TRL's SFTTrainer; saves to out_dir."""
    from datasets import Dataset, disable_progress_bars  # type: ignore[import-untyped]
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    disable_progress_bars()  # a warm-up is a step of a larger run: keep its output quiet
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = [{"messages": messages(a, b) + [{"role": "assistant", "content": answer(a, b)}]} for a, b in TRAIN]
    args = SFTConfig(
        output_dir=str(Path(out_dir) / "sft-checkpoints"),
        max_steps=steps,
        per_device_train_batch_size=16,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    trainer.train()
    out = Path(out_dir)
    trainer.save_model(str(out))
    tokenizer.save_pretrained(out)
    return out


class LocalSampler:
    """Samples chat completions from a transformers model in process, returning token ids and the
    behaviour logprob of each sampled token (temperature 1: exactly the model's own)."""

    def __init__(self, model: PreTrainedModel, tokenizer, max_new_tokens: int = 10) -> None:
        # Any: nn.Module's attribute lookup types `generate` as a Tensor
        self.model: Any = model
        self.tokenizer, self.max_new_tokens = tokenizer, max_new_tokens

    def prompt_ids(self, chat: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    @torch.no_grad()
    def sample(
        self, prompts: list[list[int]], greedy: bool = False, seed: int | None = None
    ) -> list[tuple[list[int], np.ndarray]]:
        """(completion ids, behaviour logprobs) per prompt; generation stops at EOS."""
        if seed is not None:
            torch.manual_seed(seed)
        self.model.eval()
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # left padding
        attention = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=self.max_new_tokens,
            do_sample=not greedy,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=pad,
            eos_token_id=self.tokenizer.eos_token_id,
        )
        new = out.sequences[:, width:]
        logprobs = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)
        chosen = logprobs.gather(-1, new[:, :, None]).squeeze(-1)
        results = []
        for row in range(len(prompts)):
            ids = new[row].tolist()
            end = ids.index(self.tokenizer.eos_token_id) + 1 if self.tokenizer.eos_token_id in ids else len(ids)
            results.append((ids[:end], chosen[row, :end].numpy().astype(np.float64)))
        return results

    def text(self, completion: list[int]) -> str:
        return self.tokenizer.decode(completion, skip_special_tokens=True)


def evaluate(sampler: LocalSampler, pairs: list[tuple[int, int]], samples_per_pair: int = 4, seed: int = 1234) -> float:
    """Mean reward over `pairs`, sampling at temperature 1."""
    prompts = [sampler.prompt_ids(messages(a, b)) for a, b in pairs for _ in range(samples_per_pair)]
    results = sampler.sample(prompts, seed=seed)
    owners = [pair for pair in pairs for _ in range(samples_per_pair)]
    return float(np.mean([reward(sampler.text(ids), a, b) for (ids, _), (a, b) in zip(results, owners)]))


def follow_up(a: int, b: int, previous: str) -> list[dict]:
    """A rewritten context (a new conversation quoting the previous answer): never a prefix of the
    last call's sequence, so each call of a multi-call rollout becomes a sample of its own."""
    return [{"role": "system", "content": f"Check: {previous.strip()[:40]}"}] + messages(a, b)


def retry_unformatted(max_calls: int = 3):
    """A harness policy: ask again (in a rewritten context) while the answer is not in the format."""
    return lambda a, b, text, calls: calls < max_calls and not formatted(text)


def run_rollouts(
    sampler: LocalSampler,
    pairs,
    group_size: int,
    again=None,
    seed: int | None = None,
) -> list:
    """group_size rollouts per pair; a rollout makes another call while again(a, b, last text, calls so
    far) says so (default: one call); the reward scores the last answer. Returns trainer
    RolloutRecords (one chain per call: a rewritten context never extends the last sequence)."""
    from lightning_otel.trainer.merge import LLMCall
    from lightning_otel.trainer.rollout_data import RolloutRecord

    jobs = [(a, b, g) for a, b in pairs for g in range(group_size)]
    histories: dict[tuple, list] = {job: [] for job in jobs}
    texts: dict[tuple, str] = {}
    active, turn = list(jobs), 0
    while active:
        chats = [messages(a, b) if turn == 0 else follow_up(a, b, texts[(a, b, g)]) for a, b, g in active]
        prompts = [sampler.prompt_ids(chat) for chat in chats]
        for job, prompt, (ids, logprobs) in zip(
            active, prompts, sampler.sample(prompts, seed=None if seed is None else seed + turn)
        ):
            histories[job].append(LLMCall(f"{job}-{turn}", np.asarray(prompt), np.asarray(ids), logprobs, "0"))
            texts[job] = sampler.text(ids)
        turn += 1
        active = [job for job in active if again is not None and again(job[0], job[1], texts[job], turn)]
    return [
        RolloutRecord(
            f"{a}-{b}-{g}", f"{a}+{b}", reward(texts[(a, b, g)], a, b), chains=[[call] for call in histories[(a, b, g)]]
        )
        for a, b, g in jobs
    ]


def rl_iteration(
    model,
    optimizer,
    sampler: LocalSampler,
    pairs,
    group_size: int,
    config,
    again=None,
    seed: int | None = None,
) -> dict:
    """One on-policy iteration through the trainer's own code path: run_rollouts, then build_batch and
    policy_update."""
    from lightning_otel.trainer.rollout_data import Selection
    from lightning_otel.trainer.update import build_batch, policy_update

    rollouts = run_rollouts(sampler, pairs, group_size, again, seed)
    batch = build_batch(Selection(rollouts, {}), config=config)
    metrics = policy_update(model, optimizer, batch, config)
    metrics["mean_reward"] = float(np.mean([r.reward for r in rollouts]))
    metrics["samples_per_rollout"] = batch.samples_per_rollout
    return metrics
