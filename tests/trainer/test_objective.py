"""Advantages, rollout-level normalization and the PPO-clip loss on hand-computed examples."""

import math

import pytest
import torch

from lightning_otel.trainer.merge import Sample
from lightning_otel.trainer.objective import group_advantages, ppo_clip_token_loss, rollout_token_weights


def test_group_advantages_z_score_within_each_task():
    # task a: rewards 1, 0 -> mean 0.5, population std 0.5 -> +1, -1
    # task b: rewards 2, 2, 5 -> mean 3, std sqrt(((1+1+4)/3)) = sqrt(2)
    adv = group_advantages([1.0, 0.0, 2.0, 2.0, 5.0], ["a", "a", "b", "b", "b"], eps=0.0)
    assert adv[:2] == pytest.approx([1.0, -1.0])
    assert adv[2:] == pytest.approx([-1 / math.sqrt(2), -1 / math.sqrt(2), 2 / math.sqrt(2)])


def test_group_advantages_mean_only_and_zero_variance():
    adv = group_advantages([3.0, 1.0, 7.0, 7.0], ["a", "a", "b", "b"], scale_by_std=False)
    assert adv == [1.0, -1.0, 0.0, 0.0]  # task b has no variance: no signal


def test_group_advantages_reject_non_finite():
    with pytest.raises(ValueError, match="non-finite"):
        group_advantages([1.0, float("nan")], ["a", "a"])


def test_rollout_split_into_three_samples_weighs_the_same_as_one_sample():
    # rollout 0: one sample with 4 generated tokens; rollout 1: three samples, 1 + 2 + 3 tokens
    masks = [[0, 1, 1, 1, 1], [0, 1], [0, 0, 1, 1], [1, 1, 1]]
    weights = [w.tolist() for w in rollout_token_weights(masks, [0, 1, 1, 1])]
    # R = 2: rollout 0 tokens weigh 1/(2*4); rollout 1 tokens weigh 1/(2*6)
    assert weights[0] == [0.0, 0.125, 0.125, 0.125, 0.125]
    assert weights[1] == [0.0, pytest.approx(1 / 12)]
    assert weights[3] == [pytest.approx(1 / 12)] * 3
    per_rollout = [sum(weights[0]), sum(sum(w) for w in weights[1:])]
    assert per_rollout == [pytest.approx(0.5), pytest.approx(0.5)]
    # with sample-level normalization rollout 1 would have weighed 3/4 of the batch instead


def test_rollout_level_loss_is_mean_over_rollouts_of_token_means():
    # per-token losses for the batch above, chosen by hand
    masks = [[1, 1], [1], [1, 1, 1]]
    rollout_of_sample = [0, 1, 1]
    losses = [[2.0, 4.0], [1.0], [3.0, 5.0, 7.0]]
    weights = rollout_token_weights(masks, rollout_of_sample)
    total = sum(w * loss for ws, ls in zip(weights, losses) for w, loss in zip(ws, ls))
    # rollout 0 mean = 3, rollout 1 mean = (1+3+5+7)/4 = 4 -> (3 + 4) / 2
    assert total == pytest.approx(3.5)


def test_ppo_clip_on_hand_computed_tokens():
    behaviour = torch.zeros(4)
    logprobs = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.7]))  # ratios 1.5, 0.5, 1.1, 0.7
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, clipped = ppo_clip_token_loss(logprobs, behaviour, advantages, eps_low=0.2, eps_high=0.28)
    # A>0: min(1.5, 1.28) = 1.28 (clipped); min(0.5, 0.8) = 0.5
    # A<0: min(-1.1, -1.1) = -1.1; min(-0.7, -0.8) = -0.8 (clipped)
    assert loss.tolist() == pytest.approx([-1.28, -0.5, 1.1, 0.8])
    assert clipped.tolist() == [True, False, False, True]


def test_sample_helper_counts_generated_tokens():
    import numpy as np

    sample = Sample(np.array([1, 2, 3]), np.array([0, 1, 1]), np.array([0.0, -1.0, -1.0]))
    assert sample.generated_tokens == 2


def test_each_normalization_on_a_hand_computed_batch():
    from lightning_otel.trainer.objective import token_weights

    # samples: rollout 0 -> [2 tokens]; rollout 1 -> [1 token], [3 tokens]
    masks, owner = [[0, 1, 1], [1], [0, 1, 1, 1]], [0, 1, 1]
    weights = {
        n: [w.tolist() for w in token_weights(masks, owner, n, fixed_length=4)]
        for n in ("rollout", "sample", "batch_token", "fixed_length")
    }
    assert weights["rollout"] == [[0, 1 / 4, 1 / 4], [1 / 8], [0, 1 / 8, 1 / 8, 1 / 8]]  # 1/(R*T_r): T_0 = 2, T_1 = 4
    assert weights["sample"] == [[0, 1 / 6, 1 / 6], [1 / 3], [0, 1 / 9, 1 / 9, 1 / 9]]  # 1/(S*T_s), S = 3
    assert weights["batch_token"] == [[0, 1 / 6, 1 / 6], [1 / 6], [0, 1 / 6, 1 / 6, 1 / 6]]  # 1/T, T = 6
    assert weights["fixed_length"] == [[0, 1 / 12, 1 / 12], [1 / 12], [0, 1 / 12, 1 / 12, 1 / 12]]  # 1/(S*L), L = 4
    with pytest.raises(ValueError, match="normalization"):
        token_weights(masks, owner, "per_token")


def _selection_split(rewards_and_splits):
    """Rollouts of one task; each split into the given number of samples (calls that never extend)."""

    from lightning_otel.trainer.merge import LLMCall
    from lightning_otel.trainer.rollout_data import RolloutRecord, Selection

    rollouts = []
    for index, (reward, splits) in enumerate(rewards_and_splits):
        calls = [LLMCall(f"{index}-{k}", [100 + k], [7, 8], [-1.0, -1.0]) for k in range(splits)]
        rollouts.append(RolloutRecord(f"r{index}", "task", reward, chains=[calls]))
    return Selection(rollouts, {})


def test_advantage_levels_on_a_rollout_split_into_three_samples():
    import math

    from lightning_otel.trainer.update import UpdateConfig, build_batch

    selection = _selection_split([(1.0, 3), (0.0, 1)])
    per_rollout = build_batch(selection, config=UpdateConfig(advantage_level="rollout"))
    assert per_rollout.advantages == pytest.approx([1.0, 1.0, 1.0, -1.0], abs=1e-5)  # z-score of [1, 0]
    per_sample = build_batch(selection, config=UpdateConfig(advantage_level="sample"))
    std = math.sqrt((3 * 0.25**2 + 0.75**2) / 4)  # samples' rewards [1, 1, 1, 0], mean 0.75
    assert per_sample.advantages == pytest.approx([0.25 / std] * 3 + [-0.75 / std], abs=1e-5)
    # rollout-level normalization: the split rollout's three samples weigh what the whole one does
    weights = [w.sum() for w in per_rollout.token_weights]
    assert sum(weights[:3]) == pytest.approx(weights[3]) == pytest.approx(0.5)


def test_groups_without_reward_variance_are_reported():
    from lightning_otel.trainer.update import build_batch

    batch = build_batch(_selection_split([(1.0, 1), (1.0, 2)]))
    assert batch.zero_variance_groups == ["task"] and batch.advantages == [0.0, 0.0, 0.0]


def test_dual_clip_caps_the_loss_of_negative_advantages_on_hand_computed_tokens():
    logprobs = torch.log(torch.tensor([5.0, 2.0, 5.0, 0.5]))  # ratios 5, 2, 5, 0.5 against behaviour 0
    advantages = torch.tensor([-1.0, -1.0, 1.0, -2.0])
    loss, clipped = ppo_clip_token_loss(logprobs, torch.zeros(4), advantages, 0.2, 0.28, dual_clip=3.0)
    # A<0, r=5: PPO gives 5, the dual-clip caps it at 3; r=2: 2 (under the cap); A>0, r=5: PPO clip -1.28;
    # A<0, r=0.5: PPO clip at 0.8 -> 1.6
    assert loss.tolist() == pytest.approx([3.0, 2.0, -1.28, 1.6])
    assert clipped.tolist() == [True, False, True, True]
    plain, _ = ppo_clip_token_loss(logprobs, torch.zeros(4), advantages, 0.2, 0.28)  # dual_clip off
    assert plain.tolist() == pytest.approx([5.0, 2.0, -1.28, 1.6])
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_token_loss(logprobs, torch.zeros(4), advantages, dual_clip=1.0)


def test_log_ratio_clamp_on_hand_computed_tokens_and_its_gradient_stays_finite():
    old = torch.zeros(3)
    log_ratio = torch.tensor([30.0, -30.0, 5.0], requires_grad=True)
    advantages = torch.tensor([-1.0, 1.0, -1.0])
    loss, _ = ppo_clip_token_loss(log_ratio, old, advantages, 0.2, 0.28, log_ratio_clamp=20.0)
    # r = e^20 (not e^30) with A<0 and no dual-clip: the loss is e^20; r = e^-20 with A>0: -e^-20
    assert loss.tolist() == pytest.approx([math.exp(20.0), -math.exp(-20.0), math.exp(5.0)], rel=1e-6)
    # A log-ratio past float32's exp range: without the clamp exp() is inf and the clipped branch's zero
    # gradient times inf is NaN; with it the gradient is exactly 0.
    huge = torch.tensor([100.0, 100.0], requires_grad=True)
    loss, _ = ppo_clip_token_loss(huge, torch.zeros(2), torch.tensor([1.0, -1.0]), 0.2, 0.28, 20.0, 3.0)
    loss.sum().backward()
    assert loss.tolist() == pytest.approx([-1.28, 3.0]) and huge.grad.tolist() == [0.0, 0.0]


def test_k3_kl_and_its_clamp():
    from lightning_otel.trainer.objective import k3_kl

    logprobs, reference = torch.tensor([-1.0, -2.0, -30.0]), torch.tensor([-1.0, -1.0, 0.0])
    assert k3_kl(logprobs, reference).tolist() == pytest.approx([0.0, math.e - 2.0, math.exp(30) - 31], rel=1e-6)
    assert k3_kl(logprobs, reference, 20.0)[2].item() == pytest.approx(math.exp(20) - 21, rel=1e-6)


def test_zero_variance_is_detected_with_a_tolerance_and_a_group_of_one_has_no_signal():
    from lightning_otel.trainer.objective import group_advantages_with_report

    # 0.1 + 0.2 != 0.3 in floating point: a std of ~3e-17, no signal
    advantages, flat = group_advantages_with_report([0.1 + 0.2, 0.3, 1.0, 0.0, 5.0], ["a", "a", "b", "b", "lone"])
    assert flat == ["a", "lone"] and advantages[:2] == [0.0, 0.0] and advantages[4] == 0.0
    assert advantages[2:4] == pytest.approx([1.0, -1.0], abs=1e-5)


def test_fixed_length_needs_its_constant_and_an_all_masked_batch_is_a_clear_error():
    from lightning_otel.trainer.objective import token_weights

    with pytest.raises(ValueError, match="fixed_length"):
        token_weights([[0, 1, 1]], [0], "fixed_length")
    for normalization in ("rollout", "sample", "batch_token", "fixed_length"):
        with pytest.raises(ValueError, match="every token is masked"):
            token_weights([[0, 0], [0]], [0, 1], normalization, fixed_length=4)


def test_huge_finite_rewards_give_finite_z_scores():
    # (1e300 - 5e299) ** 2 overflows float64: the std is computed scaled, so the z-score is still +-1
    assert group_advantages([1e300, 0.0], ["a", "a"]) == pytest.approx([1.0, -1.0])
    assert group_advantages([1e300, 0.0], ["a", "a"], scale_by_std=False) == pytest.approx([5e299, -5e299])


def _z_scores(rewards, groups, eps=1e-6):
    """The reference: (x - mean) / (population std + eps) within each group, written out."""
    out = []
    for reward, group in zip(rewards, groups):
        members = [r for r, g in zip(rewards, groups) if g == group]
        mean = sum(members) / len(members)
        std = math.sqrt(sum((m - mean) ** 2 for m in members) / len(members))
        out.append((reward - mean) / (std + eps))
    return out


def test_the_std_epsilon_matters_when_the_rewards_barely_differ():
    """Rewards 0 and 2e-7: std 1e-7 (past the zero-variance tolerance of 1e-8), so the epsilon of
    1e-6 dominates: +-1e-7 / 1.1e-6 = +-0.0909, not the +-1 of a z-score without it."""
    advantages = group_advantages([0.0, 2e-7, 1.0, 0.0], ["tiny", "tiny", "unit", "unit"])
    assert advantages == pytest.approx(_z_scores([0.0, 2e-7, 1.0, 0.0], ["tiny", "tiny", "unit", "unit"]), rel=1e-9)
    assert advantages[:2] == pytest.approx([-1 / 11, 1 / 11], rel=1e-6)
    assert advantages[2:] == pytest.approx([1 / (1 + 2e-6), -1 / (1 + 2e-6)], rel=1e-9)  # eps next to std 0.5


def test_sample_level_advantages_over_several_tasks():
    """advantage_level = "sample": every sample is a unit with its rollout's reward, normalized
    within its rollout's task, for each task separately (a rollout split in k samples counts k times)."""
    from lightning_otel.trainer.merge import LLMCall
    from lightning_otel.trainer.rollout_data import RolloutRecord, Selection
    from lightning_otel.trainer.update import UpdateConfig, build_batch

    plan = [  # (task, reward, samples): tasks interleaved, so a grouping by position would differ
        ("x", 1.0, 3),
        ("y", 5.0, 1),
        ("x", 0.0, 1),
        ("z", 2.0, 2),
        ("y", 1.0, 2),
        ("x", 0.5, 2),
        ("z", -2.0, 1),
    ]
    rollouts = []
    for index, (task, reward, splits) in enumerate(plan):
        calls = [LLMCall(f"{index}-{k}", [100 + k, index], [7, 8], [-1.0, -1.0]) for k in range(splits)]
        rollouts.append(RolloutRecord(f"r{index}", task, reward, chains=[calls]))
    batch = build_batch(Selection(rollouts, {}), config=UpdateConfig(advantage_level="sample"))
    units = [(task, reward) for task, reward, splits in plan for _ in range(splits)]
    assert [plan[r][0] for r in batch.rollout_of_sample] == [task for task, _ in units]
    want = _z_scores([reward for _, reward in units], [task for task, _ in units])
    assert batch.advantages == pytest.approx(want, rel=1e-9)
    # and not the rollout-level ones (each rollout counted once in its task)
    per_rollout = _z_scores([reward for _, reward, _ in plan], [task for task, _, _ in plan])
    assert batch.advantages != pytest.approx([per_rollout[r] for r in batch.rollout_of_sample], rel=1e-3)
