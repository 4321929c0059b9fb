"""Sharded rollouts for data-parallel training: each rank samples a share, every rank gets the whole batch.

`ShardedRolloutPolicy` wraps a Policy; its `generate` splits the prompts into W contiguous
blocks (backends.rollout.shard_bounds), samples rank r's block from the r-th seed of one
draw of the step's RNG (draw_shard_seeds: every rank draws alike, so the ranks' global RNGs
stay in lockstep), and all-gathers the responses in rank order. The result is prompt-major
like one process's, and equals what `rollout.sampling_shards: W` samples in a single
process. Everything downstream (rewards, selector update, advantages, eval) then runs on
identical data on every rank, so the ranks' selectors never diverge. Other attributes are
the wrapped policy's.
"""

from __future__ import annotations

from typing import Any

import torch

from grpo_zoo.backends.train_backend import DistContext
from grpo_zoo.types import RolloutBatch


class ShardedRolloutPolicy:
    """A Policy whose `generate` is split over the ranks of a process group."""

    def __init__(self, policy: Any, dist: DistContext):
        self.inner = policy
        self.dist = dist

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, encoded: Any, **kwargs: Any) -> RolloutBatch:
        """Policy.generate over all ranks: same arguments, the same prompt-major RolloutBatch on every rank."""
        import torch.distributed as dist

        from grpo_zoo.backends.rollout import concat_rollouts, draw_shard_seeds, select_encoded, shard_bounds

        bounds = shard_bounds(len(encoded), self.dist.world_size)  # no empty blocks: ranks >= n sample nothing
        seeds = draw_shard_seeds(len(bounds))
        payload = None
        if self.dist.rank < len(bounds):
            a, b = bounds[self.dist.rank]
            devices = [self.inner.device] if self.inner.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seeds[self.dist.rank])
                local = self.inner.generate(select_encoded(encoded, a, b), **kwargs)
            # Prompts and their processor outputs stay home: every rank already holds them.
            payload = {
                "prompt_index": local.prompt_index,
                "response_ids": local.response_ids,
                "response_mask": local.response_mask,
                "response_texts": local.response_texts,
                "sampler_logprobs": local.sampler_logprobs,
                "extras": {k: v for k, v in local.extras.items() if not k.startswith("prompt_")},
            }
        shares: list[Any] = [None] * self.dist.world_size
        dist.all_gather_object(shares, payload)  # in memory, between this job's own ranks
        parts = [_rebuild(encoded, bound, share) for bound, share in zip(bounds, shares)]
        return concat_rollouts(parts, self.inner.pad_token_id)


def _rebuild(encoded: Any, bound: tuple[int, int], share: dict[str, Any]) -> RolloutBatch:
    a, b = bound
    extras = dict(share["extras"])
    extras.update(prompt_token_ids=list(encoded.token_ids[a:b]), prompt_model_inputs=list(encoded.model_inputs[a:b]))
    return RolloutBatch(
        prompts=list(encoded.prompts[a:b]),
        prompt_index=share["prompt_index"],
        response_ids=share["response_ids"],
        response_mask=share["response_mask"],
        response_texts=share["response_texts"],
        sampler_logprobs=share["sampler_logprobs"],
        extras=extras,
    )


__all__ = ["ShardedRolloutPolicy"]
