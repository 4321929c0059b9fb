"""Micro-batches grouped by sequence length: the order, the unchanged gradient, the old log-probs' row order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from grpo_zoo.rollout_ops import ScoredBatch
from grpo_zoo.trainer import batched_logprobs, by_length
from grpo_zoo.types import Prompt


def _image(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (112, 112, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def rollout(policy):
    prompts = [
        Prompt(0, "<image>How many?", "3", [_image(0)]),
        Prompt(1, "<image>How many shapes are there? Step 1: count the red ones. Step 2: add.", "5", [_image(1)]),
        Prompt(2, "<image>Count.", "1", [_image(2)]),
        Prompt(3, "<image>How many blue shapes, and then how many more than the green ones?", "2", [_image(3)]),
    ]
    torch.manual_seed(0)
    return policy.generate(policy.encode(prompts), group_size=3, temperature=1.0, top_p=1.0, max_new_tokens=16)


def test_by_length_groups_rows_by_prompt_and_orders_by_length(rollout):
    prompt_lengths = torch.tensor([len(ids) for ids in rollout.extras["prompt_token_ids"]])
    assert len(set(prompt_lengths.tolist())) > 2  # the fixture really mixes lengths
    for rows in (torch.arange(rollout.num_responses), torch.tensor([11, 0, 6, 3, 4, 9, 1])):
        ordered = by_length(rollout, rows)
        assert sorted(ordered.tolist()) == sorted(rows.tolist())
        prompts = rollout.prompt_index[ordered]
        key = [(int(prompt_lengths[p]), int(p), int(rollout.response_mask[r].sum())) for r, p in zip(ordered, prompts)]
        assert key == sorted(key)  # prompt length, then prompt (its rows together), then response length


def test_length_grouped_micro_batches_give_the_whole_batch_gradient(policy, rollout):
    rows = torch.arange(rollout.num_responses)
    advantages = torch.linspace(-1.0, 1.0, rollout.num_responses)

    def gradient(chunks):
        policy.model.zero_grad(set_to_none=True)
        for chunk in chunks:
            logp, _ = policy.logprobs(rollout, chunk)
            (-(logp.sum(-1) * advantages[chunk]).sum()).backward()  # a sum over rows: chunks add up
        grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
        policy.model.zero_grad(set_to_none=True)
        return grads

    whole = gradient([rows])
    grouped = gradient(by_length(rollout, rows).split(4))
    assert whole.keys() == grouped.keys()
    for name in whole:
        torch.testing.assert_close(grouped[name], whole[name], atol=1e-5, rtol=1e-4, msg=name)


def test_batched_logprobs_return_rows_in_their_own_order(policy, rollout):
    zeros = torch.zeros(rollout.num_responses)
    batch = ScoredBatch(rollout=rollout, rewards=zeros, accuracy=zeros, shaped_rewards=zeros)
    with torch.no_grad():
        whole = policy.logprobs(rollout, torch.arange(rollout.num_responses))[0]
    torch.testing.assert_close(batched_logprobs(policy, batch, micro=5), whole, atol=1e-5, rtol=0)
