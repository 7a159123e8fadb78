"""policy_update's loss and gradients against an independent reference written here from the
definitions in objective.py's docstring: plain torch, each sample scored alone by a plain forward
(unpadded, no attention mask), advantages, clipping, dual-clip, TIS, KL and the rollout-level weights
computed by hand. The batch is off-policy (behaviour logprobs differ from the trainer's by chosen
ratios, so clipping is active on both sides and the asymmetric epsilons matter), one rollout is
split into three samples, one merges two calls around masked tool tokens, one has a reconstructed
call (no behaviour logprobs: on-policy), and one has a -inf behaviour logprob (masked by hygiene).
Every layout and several micro-batch sizes must give the reference's loss and gradient."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from lightning_otel.trainer.layout import LAYOUTS
from lightning_otel.trainer.merge import LLMCall
from lightning_otel.trainer.rollout_data import RolloutRecord, Selection
from lightning_otel.trainer.update import UpdateConfig, build_batch, policy_update

EPS_LOW, EPS_HIGH, DUAL_CLIP, LOG_RATIO_CLAMP = 0.2, 0.28, 3.0, 20.0
TIS_CAP, KL_COEF = 2.0, 0.1
# pi_theta / pi_behaviour per generated token, cycled. 1.25 and 0.75 lie between the two epsilons
# (clipped on one side only if eps_low and eps_high were swapped), 5 is past the dual-clip, e^25
# past the log-ratio clamp. (e^-25 would need a behaviour logprob ~25 above the trainer's ~-6: a
# positive one, impossible, which input hygiene masks; e^-3 is far below the PPO clip instead.)
RATIOS = [1.5, 0.5, 1.25, 0.75, 5.0, 1.0, 0.9, 1.1, math.exp(25.0), math.exp(-3.0), 1.2, 0.7]


def _plain_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i = 1..n-1, from one unpadded sequence."""
    logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def _spec(seed: int = 5):
    """Rollouts as sample specs: each sample a list of (token ids, generated?) segments; its calls
    are (everything before a generated segment, that segment); a rollout's calls form one chain."""
    rng = np.random.default_rng(seed)
    tokens = lambda n: rng.integers(3, 500, n).tolist()  # noqa: E731
    p, q = tokens(20), tokens(18)
    return [  # (rollout id, task, reward, samples)
        ("a0", "a", 1.0, [[(p + tokens(3), False), (tokens(4), True), (tokens(3), False), (tokens(3), True)]]),
        (
            "a1",
            "a",
            0.0,
            [
                [(p + tokens(2), False), (tokens(3), True)],
                [(p + tokens(4), False), (tokens(2), True)],
                [(p + tokens(1), False), (tokens(5), True)],
            ],
        ),
        ("a2", "a", 0.25, [[(p + tokens(2), False), (tokens(5), True)], [(tokens(6), False), (tokens(3), True)]]),
        ("b0", "b", 2.0, [[(q + tokens(2), False), (tokens(6), True)]]),
        ("b1", "b", -1.0, [[(q + tokens(3), False), (tokens(4), True)]]),
    ]


RECONSTRUCTED = ("a2", 1)  # this sample's call has no behaviour logprobs
MASKED = ("b1", 0, 2)  # this generated token's behaviour logprob is -inf


def _selection_and_reference_inputs(model):
    """The Selection policy_update trains on, and per sample what the reference needs."""
    rollouts, samples, counter = [], [], 0
    for rid, task, reward, specs in _spec():
        chain = []  # one chain per rollout: calls of different samples do not extend each other
        for index, segments in enumerate(specs):
            ids = [t for part, _ in segments for t in part]
            generated = [g for part, g in segments for _ in part]
            with torch.no_grad():
                trainer_lp = [0.0] + _plain_logprobs(model, ids).tolist()
            behaviour = []
            for position, is_generated in enumerate(generated):
                if is_generated:
                    behaviour.append(trainer_lp[position] - math.log(RATIOS[counter % len(RATIOS)]))
                    counter += 1
                else:
                    behaviour.append(None)
            reconstructed = (rid, index) == RECONSTRUCTED
            calls, at = [], 0
            for part, is_generated in segments:
                if is_generated:
                    lps = [math.nan] * len(part) if reconstructed else behaviour[at : at + len(part)]
                    calls.append(LLMCall(f"{rid}-{index}-{at}", ids[:at], part, lps, reconstructed=reconstructed))
                at += len(part)
            gen_positions = [i for i, g in enumerate(generated) if g]
            if (rid, index) == MASKED[:2]:
                bad = gen_positions[MASKED[2]]
                first = calls[0]
                offset = bad - len(first.prompt_ids)
                first.logprobs[offset] = -math.inf
                generated[bad] = False  # masked: no loss, not counted
            chain += calls
            samples.append(
                dict(
                    rollout=rid,
                    task=task,
                    reward=reward,
                    ids=ids,
                    generated=generated,
                    behaviour=behaviour,
                    on_policy=reconstructed,
                )
            )
        rollouts.append(RolloutRecord(rid, task, reward, chains=[chain]))
    return Selection(rollouts, {}), samples


def _reference(model, reference_model, samples, tis: bool, dual_clip: float = DUAL_CLIP):
    """The loss and its gradient, from the definitions, one sample at a time."""
    rewards = {s["rollout"]: (s["task"], s["reward"]) for s in samples}
    advantage = {}
    for task in {t for t, _ in rewards.values()}:
        values = [r for t, r in rewards.values() if t == task]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))  # population std
        for rid, (t, r) in rewards.items():
            if t == task:
                advantage[rid] = (r - mean) / (std + 1e-6)
    tokens_of = {rid: sum(sum(s["generated"]) for s in samples if s["rollout"] == rid) for rid in rewards}
    n_rollouts = sum(1 for count in tokens_of.values() if count > 0)
    total, regimes = torch.zeros((), dtype=torch.float32), set()
    for s in samples:
        a = advantage[s["rollout"]]
        weight = 1.0 / (n_rollouts * tokens_of[s["rollout"]])
        lp = _plain_logprobs(model, s["ids"])
        with torch.no_grad():
            ref_lp = _plain_logprobs(reference_model, s["ids"])
        for position, is_generated in enumerate(s["generated"]):
            if not is_generated:
                continue
            logp = lp[position - 1]
            behaviour = logp.detach() if s["on_policy"] else torch.tensor(s["behaviour"][position])
            old = logp.detach() if tis else behaviour
            ratio = torch.exp(torch.clamp(logp - old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
            loss = torch.maximum(-ratio * a, -torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * a)
            if a < 0:
                loss = torch.minimum(loss, torch.tensor(-dual_clip * a))
            if tis:
                loss = loss * torch.clamp(torch.exp(old - behaviour), max=TIS_CAP)
            delta = ref_lp[position - 1] - logp
            loss = loss + KL_COEF * (torch.exp(delta) - delta - 1.0)
            total = total + weight * loss
            r = float(torch.exp(logp.detach() - behaviour))
            regimes.add(
                (
                    a > 0,
                    "high"
                    if r > 1 + EPS_HIGH
                    else "between-high"
                    if r > 1 + EPS_LOW
                    else "low"
                    if r < 1 - EPS_HIGH
                    else "between-low"
                    if r < 1 - EPS_LOW
                    else "inside",
                    r > dual_clip,
                    tis and r > TIS_CAP,
                )
            )
    grads = torch.autograd.grad(total, [p for p in model.parameters()], allow_unused=True)
    return total.item(), [torch.zeros_like(p) if g is None else g for p, g in zip(model.parameters(), grads)], regimes


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = copy.deepcopy(model).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in reference.parameters():  # a reference that differs: the KL term and its gradient are not 0
            parameter.add_(0.02 * torch.randn_like(parameter))
    return model, reference


@pytest.mark.parametrize(
    "tis, dual_clip",
    [(False, DUAL_CLIP), (True, DUAL_CLIP), (False, math.inf)],
    ids=["behaviour-ratio", "tis_cap", "no-dual-clip"],
)
def test_policy_update_matches_the_reference_in_every_layout(models, tis, dual_clip):
    """no-dual-clip: the e^25 ratio of a negative advantage is then bounded by the log-ratio clamp
    alone (e^20): the update must apply it (without, the loss is ~150 times the reference's)."""
    model, reference_model = models
    selection, samples = _selection_and_reference_inputs(model)
    want_loss, want_grads, regimes = _reference(model, reference_model, samples, tis, dual_clip)
    if not math.isfinite(dual_clip):  # the clamp is what bounds this batch's loss
        assert any(not positive and where == "high" for positive, where, *_ in regimes)
    elif tis:  # the cap truncates some weights, others stay below it
        assert any(r[3] for r in regimes) and any(not r[3] for r in regimes)
    else:  # the batch exercises both clips on both sides, the ranges between the epsilons, the dual-clip
        for needed in [
            (True, "high"),
            (False, "low"),
            (True, "between-high"),
            (False, "between-low"),
            (True, "inside"),
        ]:
            assert any(r[:2] == needed for r in regimes), needed
        assert any(not positive and beyond_dual for positive, _, beyond_dual, _ in regimes)
    config_args = dict(
        eps_low=EPS_LOW,
        eps_high=EPS_HIGH,
        dual_clip=dual_clip,
        log_ratio_clamp=LOG_RATIO_CLAMP,
        kl_coef=KL_COEF,
        tis_cap=TIS_CAP if tis else None,
        max_grad_norm=math.inf,
        pack_length=64,
    )
    batch = build_batch(selection, config=UpdateConfig(**config_args))
    assert len(batch.samples) == 8 and batch.samples_per_rollout_histogram() == [3, 1, 1]
    assert [m.span_id for m in batch.masked_calls] == ["b1-0-21"]
    for layout in LAYOUTS:
        for micro_batch_size in (1, 3, 64):
            config = UpdateConfig(**config_args, layout=layout, micro_batch_size=micro_batch_size)
            metrics = policy_update(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, config, reference_model)
            where = f"{layout}, micro-batch {micro_batch_size}"
            assert metrics["loss"] == pytest.approx(want_loss, rel=1e-5, abs=1e-6), where
            assert metrics["kl"] > 0
            for got, want in zip([p.grad for p in model.parameters()], want_grads):
                assert torch.allclose(got, want, rtol=1e-4, atol=1e-6), (where, (got - want).abs().max().item())
    assert any(g.abs().max() > 1e-4 for g in want_grads)
