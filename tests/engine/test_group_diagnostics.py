"""The per-step group diagnostics of ALGORITHMS.md ("Diagnostics every run logs")."""

import torch

from grpo_zoo.metrics import group_diagnostics, group_diagnostics_by_variant


def test_all_wrong_and_all_right_are_judged_on_accuracy_not_reward():
    # 4 groups of 3: all wrong but formats differ (rewards 0.1 / 0), all right, mixed, all wrong and unformatted.
    index = torch.arange(4).repeat_interleave(3)
    accuracy = torch.tensor([0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0], dtype=torch.float)
    formatted = torch.tensor([1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0], dtype=torch.float)
    rewards = 0.9 * accuracy + 0.1 * formatted
    out = group_diagnostics(rewards, index, accuracy)
    assert out["groups/all_wrong"] == 0.5  # groups 0 and 3, although group 0's rewards are not all 0
    assert out["groups/all_correct"] == 0.25
    assert out["groups/effective_gradient_ratio"] == 0.5  # groups 0 (format) and 2 have reward variance


def test_groups_need_not_be_contiguous():
    index = torch.tensor([5, 9, 5, 9])
    accuracy = torch.tensor([1.0, 0.0, 1.0, 0.0])
    out = group_diagnostics(accuracy, index, accuracy)
    assert out == {"groups/effective_gradient_ratio": 0.0, "groups/all_correct": 0.5, "groups/all_wrong": 0.5}


def test_by_variant_splits_the_groups_by_prompt_kind():
    # Prompts 0, 1 original (one all-wrong, one mixed), 2 hint (all right), 3 perturb (all wrong); G = 2.
    index = torch.arange(4).repeat_interleave(2)
    accuracy = torch.tensor([0, 0, 1, 0, 1, 1, 0, 0], dtype=torch.float)
    out = group_diagnostics_by_variant(accuracy, index, accuracy, ["original", "original", "hint", "perturb"])
    assert out["groups/original/all_wrong"] == 0.5 and out["groups/original/effective_gradient_ratio"] == 0.5
    assert out["groups/hint/all_correct"] == 1.0 and out["groups/hint/effective_gradient_ratio"] == 0.0
    assert out["groups/perturb/all_wrong"] == 1.0
    assert len(out) == 9


def test_by_variant_is_silent_for_a_batch_of_one_kind():
    index = torch.tensor([0, 0, 1, 1])
    accuracy = torch.tensor([1.0, 0.0, 1.0, 1.0])
    assert group_diagnostics_by_variant(accuracy, index, accuracy, ["original", "original"]) == {}
