"""How samples become model input rows: sorted, packed, or with shared prefixes.

A row is a list of segments; a segment is a sample's tokens from some offset on, optionally
hanging off a prefix segment it continues. Three layouts:

- sorted (default): one sample per row, longest first, so a micro-batch holds samples of similar
  length; right padding under the plain causal mask needs no attention mask at all.
- packed: samples first-fit-decreasing into rows of up to `pack_length` tokens, each its own block
  of a block-diagonal causal mask. Least padding; on CPU the masked attention costs more than the
  padding it saves (it pays where kernels skip masked blocks, e.g. varlen flash attention).
- shared_prefix: the samples of one task usually start with the same prompt (GRPO samples several
  completions per prompt; agent rollouts of a task share system prompt and task text). Their common
  prefix (never generated tokens) is computed once; every sample's rest attends to it and to itself.
  The first token after the prefix is scored from the prefix's last position, so each sample's
  log-probabilities are exactly what its own full sequence would give.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

LAYOUTS = ("sorted", "packed", "shared_prefix")
MIN_SHARED_PREFIX = 16  # shorter common prefixes are not worth a custom mask


@dataclass
class Segment:
    sample: int
    start: int  # offset into the sample's tokens
    length: int
    parent: int | None = None  # index of the prefix segment (in the same row) this one continues
    is_prefix: bool = False  # a shared prefix: no loss on it


@dataclass
class Row:
    segments: list[Segment] = field(default_factory=list)
    length: int = 0
    masked: bool = False  # needs an explicit attention mask


def _common_prefix(samples, indices: list[int]) -> int:
    """Longest prefix shared by all the samples' tokens and never generated in any of them."""
    first = samples[indices[0]]
    length = min(len(samples[i].token_ids) for i in indices)
    for i in indices:
        generated = np.flatnonzero(samples[i].loss_mask[:length])
        length = min(length, int(generated[0]) if len(generated) else length)
    for i in indices[1:]:
        different = np.flatnonzero(samples[i].token_ids[:length] != first.token_ids[:length])
        length = min(length, int(different[0]) if len(different) else length)
    return length


def plan_rows(samples, groups: list[str], layout: str, pack_length: int | None) -> list[Row]:
    lengths = [len(s.token_ids) for s in samples]
    if layout == "sorted":
        return [
            Row([Segment(i, 0, lengths[i])], lengths[i]) for i in sorted(range(len(samples)), key=lambda i: -lengths[i])
        ]
    if layout == "packed":
        capacity = max(pack_length or 0, max(lengths, default=0))
        rows: list[Row] = []
        for index in sorted(range(len(samples)), key=lambda i: -lengths[i]):
            row = next((r for r in rows if r.length + lengths[index] <= capacity), None)
            if row is None:
                row = Row(masked=True)
                rows.append(row)
            row.segments.append(Segment(index, 0, lengths[index]))
            row.length += lengths[index]
        return rows
    if layout != "shared_prefix":
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    by_group: dict[str, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        by_group[group].append(index)
    rows = []
    capacity = pack_length or 4096
    for indices in by_group.values():
        prefix = _common_prefix(samples, indices) if len(indices) > 1 else 0
        if prefix < MIN_SHARED_PREFIX:
            rows += [Row([Segment(i, 0, lengths[i])], lengths[i]) for i in indices]
            continue
        row = None
        for i in sorted(indices, key=lambda i: -lengths[i]):
            rest = lengths[i] - prefix
            if row is None or row.length + rest > max(capacity, prefix + rest):
                row = Row([Segment(i, 0, prefix, is_prefix=True)], prefix, masked=True)  # taken from this sample
                rows.append(row)
            row.segments.append(Segment(i, prefix, rest, parent=0))
            row.length += rest
    return sorted(rows, key=lambda r: -r.length)


def row_tensors(
    samples, sample_weights, sample_advantages, rows: list[Row], device: torch.device
) -> dict[str, torch.Tensor]:
    """Input ids, position ids, the token each position is scored from (`source`, -1 for none),
    behaviour logprobs, weights, advantages, generated flags, the sample each loss-bearing position
    belongs to (`sample`, -1 for none), and a 4D mask when any row needs one."""
    width = max(row.length for row in rows)
    shape = (len(rows), width)
    t = {
        "input_ids": torch.zeros(shape, dtype=torch.long),
        "position_ids": torch.zeros(shape, dtype=torch.long),
        "source": torch.full(shape, -1, dtype=torch.long),
        "behaviour": torch.zeros(shape, dtype=torch.float32),
        "weights": torch.zeros(shape, dtype=torch.float32),
        "advantages": torch.zeros(shape, dtype=torch.float32),
        "generated": torch.zeros(shape, dtype=torch.bool),
        "sample": torch.full(shape, -1, dtype=torch.long),
    }
    masked = any(row.masked for row in rows)
    mask = torch.zeros((len(rows), 1, width, width), dtype=torch.bool) if masked else None
    for r, row in enumerate(rows):
        at, placed = 0, list[tuple[int, int]]()  # placed[k] = (first column, length) of segment k
        for segment in row.segments:
            sample = samples[segment.sample]
            n = segment.length
            end = segment.start + n
            cols = slice(at, at + n)
            t["input_ids"][r, cols] = torch.from_numpy(
                np.asarray(sample.token_ids[segment.start : end], dtype=np.int64)
            )
            t["position_ids"][r, cols] = torch.arange(segment.start, end)
            t["source"][r, at + 1 : at + n] = torch.arange(at, at + n - 1)
            if segment.parent is not None:
                parent_at, parent_n = placed[segment.parent]
                t["source"][r, at] = parent_at + parent_n - 1  # scored from the prefix's last position
            if not segment.is_prefix:  # a prefix carries no loss: its tokens are never generated
                t["behaviour"][r, cols] = torch.from_numpy(
                    np.asarray(sample.behaviour_logprobs[segment.start : end], dtype=np.float32)
                )
                t["weights"][r, cols] = torch.from_numpy(
                    np.asarray(sample_weights[segment.sample][segment.start : end], dtype=np.float32)
                )
                # via float64: an advantage past float32's range becomes inf (the update then refuses the
                # step, update.NonFiniteUpdate) instead of an error here
                t["advantages"][r, cols] = torch.tensor(sample_advantages[segment.sample], dtype=torch.float64).float()
                t["generated"][r, cols] = torch.from_numpy(np.asarray(sample.loss_mask[segment.start : end]) > 0)
                t["sample"][r, cols] = segment.sample
            if mask is not None:
                mask[r, 0, cols, cols] = torch.tril(torch.ones(n, n, dtype=torch.bool))
                if segment.parent is not None:
                    parent_at, parent_n = placed[segment.parent]
                    mask[r, 0, cols, parent_at : parent_at + parent_n] = True
            placed.append((at, n))
            at += n
        # Padding continues the last positions: under a causal mask, real tokens never attend to it.
        t["position_ids"][r, at:] = torch.arange(width - at) + (int(t["position_ids"][r, at - 1]) + 1 if at else 0)
        if mask is not None:
            mask[r, 0, at:, at:] = torch.tril(torch.ones(width - at, width - at, dtype=torch.bool))
    out = {name: tensor.to(device) for name, tensor in t.items()}
    if mask is not None:  # absent: plain causal attention
        out["mask"] = mask.to(device)
    return out


def scored_logprobs(model: torch.nn.Module, t: dict[str, torch.Tensor], with_entropy: bool = False):
    """log p(token at each position | what it attends to), scored from `source` positions (0 where
    there is none), and optionally the entropy of each scoring distribution (no gradient).
    use_cache=False matters: with a cache object transformers skips packed-sequence masks."""
    kwargs = {"attention_mask": t["mask"]} if "mask" in t else {}
    logits = model(input_ids=t["input_ids"], position_ids=t["position_ids"], use_cache=False, **kwargs).logits.float()
    source = t["source"].clamp(min=0)
    scoring = torch.log_softmax(logits.gather(1, source[:, :, None].expand(-1, -1, logits.size(-1))), dim=-1)
    logprobs = scoring.gather(-1, t["input_ids"][:, :, None]).squeeze(-1) * (t["source"] >= 0)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(scoring.exp() * scoring).sum(-1) * (t["source"] >= 0)
    return logprobs, entropy
