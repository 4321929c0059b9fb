"""Rollout backends: who samples a step's responses (`hf` in-process, `ray` actors, `vllm`).

The engine talks to a backend through one request/result call,
    rollout = backend.generate(encoded, sampling, version=step)   # -> RolloutBatch
so a later asynchronous backend (one-step off-policy: generate step t+1 while step t trains)
can slot in unchanged. `version` is the number of updates the trainer's weights have taken
(the step); a backend holding its own copy of the weights loads the trainer's weights before
sampling whenever the version differs from the one it last loaded, i.e. once after each update,
and stamps the batch with the version that produced it.

Sharded sampling (`rollout.sampling_shards`): the B prompts are split into contiguous blocks,
and block k is sampled after `torch.manual_seed(seed_k)`, with seed_k derived from one draw of
the step's RNG. The samples then depend on the number of blocks, never on the number of
processes that sample them: an hf run and a Ray run with equal shards give the same responses
bit for bit on CPU (same weights, same prompts, same per-block batch shapes, same seeds).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F

from grpo_zoo.types import RolloutBatch

if TYPE_CHECKING:
    from grpo_zoo.config import Config
    from grpo_zoo.policy import EncodedPrompts, Policy

_SEED_MOD = 2**31 - 1  # seeds stay in the range every RNG (torch, numpy, vLLM) accepts


@dataclass(frozen=True)
class Sampling:
    """How to sample one rollout (rollout.* of the recipe); picklable, so it travels to workers."""

    group_size: int  # G responses per prompt
    temperature: float
    top_p: float
    max_new_tokens: int

    def kwargs(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class RolloutBackend(Protocol):
    """A rollout engine. Rows of the result are prompt-major (row i answers prompt_index[i])."""

    # True when the samples come from another engine (vLLM) whose numerics differ from the
    # trainer's, so its log-probs drift from the trainer's: the run then defaults the loss's
    # rollout correction (tis_cap "auto") on. False (or absent) when the trainer's own model code
    # samples (hf, ray workers). Read with getattr(backend, "external_sampler", False).
    external_sampler: bool

    def generate(self, encoded: EncodedPrompts, sampling: Sampling, *, version: int) -> RolloutBatch:
        """Sample sampling.group_size responses per prompt with the weights of `version`."""
        ...

    def close(self) -> None:
        """Free workers and engines (idempotent)."""
        ...


# --------------------------------------------------------------------------------------
# Sharding, seeding, merging: shared by every backend so that they sample alike
# --------------------------------------------------------------------------------------


def shard_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) blocks of n items, sizes differing by at most one, larger first.

    Never returns an empty block: with shards > n there are n blocks of one; with n = 0, none.
    """
    if shards < 1:
        raise ValueError(f"shard_bounds: shards must be >= 1, got {shards}")
    k = min(shards, n)
    bounds, start = [], 0
    for i in range(k):
        size = n // k + (1 if i < n % k else 0)
        bounds.append((start, start + size))
        start += size
    return bounds


def draw_shard_seeds(count: int) -> list[int]:
    """`count` sampling seeds from ONE draw of torch's global RNG (seeded per step by the trainer).

    Every seeded path (hf with shards >= 1, ray, vllm, data-parallel ranks) draws exactly once per
    rollout whatever `count` is, so the global RNG after the rollout, and everything the step draws
    from it later, does not depend on the backend or on the number of workers.
    """
    base = int(torch.randint(0, _SEED_MOD, ()))
    return [(base * 1_000_003 + 7919 * k) % _SEED_MOD for k in range(count)]


def select_encoded(encoded: EncodedPrompts, start: int, stop: int) -> EncodedPrompts:
    """Prompts [start, stop) of an encoded batch, re-padded to their own longest prompt."""
    from grpo_zoo.policy import EncodedPrompts, collate_prompts

    token_ids = encoded.token_ids[start:stop]
    batch = collate_prompts(token_ids, [{} for _ in token_ids], encoded.pad_token_id)
    return EncodedPrompts(
        prompts=encoded.prompts[start:stop],
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_ids=token_ids,
        model_inputs=encoded.model_inputs[start:stop],
        texts=encoded.texts[start:stop],
        pad_token_id=encoded.pad_token_id,
    )


def seeded_generate(policy: Policy, encoded: EncodedPrompts, sampling: Sampling, seed: int) -> RolloutBatch:
    """policy.generate after torch.manual_seed(seed), leaving the caller's RNG state untouched."""
    devices = [policy.device] if policy.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return policy.generate(encoded, **sampling.kwargs())


def concat_rollouts(parts: list[RolloutBatch], pad_token_id: int) -> RolloutBatch:
    """Blocks of consecutive prompts, in order, as one RolloutBatch (prompt indices offset).

    Responses are right-padded with pad_token_id (mask 0) to the longest block's T; "prompt_*"
    and "row_*" extras are concatenated, other extras are taken from the first block.
    """
    if not parts:
        raise ValueError("concat_rollouts: no blocks to merge")
    if len(parts) == 1:
        return parts[0]
    width = max(p.response_ids.shape[1] for p in parts)

    def pad(x: torch.Tensor, value: float) -> torch.Tensor:  # [n, t] -> [n, width]
        return F.pad(x, (0, width - x.shape[1]), value=value)

    offsets = [0]
    for p in parts[:-1]:
        offsets.append(offsets[-1] + len(p.prompts))
    extras = dict(parts[0].extras)
    for key, value in parts[0].extras.items():
        if key.startswith(("prompt_", "row_")):
            values = [p.extras[key] for p in parts]
            extras[key] = torch.cat(values) if isinstance(value, torch.Tensor) else [v for vs in values for v in vs]
    logprobs = [p.sampler_logprobs for p in parts]
    return RolloutBatch(
        prompts=[q for p in parts for q in p.prompts],
        prompt_index=torch.cat([p.prompt_index + off for p, off in zip(parts, offsets)]),  # [N]
        response_ids=torch.cat([pad(p.response_ids, pad_token_id) for p in parts]),  # [N, T]
        response_mask=torch.cat([pad(p.response_mask, 0) for p in parts]),  # [N, T]
        response_texts=[t for p in parts for t in p.response_texts],
        sampler_logprobs=(
            torch.cat([pad(lp, 0) for lp in logprobs]) if all(lp is not None for lp in logprobs) else None
        ),
        policy_version=parts[0].policy_version,
        extras=extras,
    )


# --------------------------------------------------------------------------------------
# hf: the trainer's own policy, in process
# --------------------------------------------------------------------------------------


class HfRollout:
    """Sample with the trainer's policy in process (no weight copy, nothing to sync).

    shards = 0: one generate call on the global RNG (the fastest on one CPU, and what runs
    before sharding existed). shards >= 1: the seeded blocks of the module docstring, one after
    another, which is exactly what `RayRollout` computes with the blocks spread over workers.
    """

    external_sampler = False  # the trainer's own model samples: sampler and trainer log-probs agree

    def __init__(self, policy: Policy, shards: int = 0):
        if shards < 0:
            raise ValueError(f"rollout.sampling_shards must be >= 0, got {shards}")
        self.policy = policy
        self.shards = shards

    def generate(self, encoded: EncodedPrompts, sampling: Sampling, *, version: int) -> RolloutBatch:
        if self.shards == 0:
            batch = self.policy.generate(encoded, **sampling.kwargs())
        else:
            bounds = shard_bounds(len(encoded), self.shards)
            seeds = draw_shard_seeds(len(bounds))
            parts = [
                seeded_generate(self.policy, select_encoded(encoded, a, b), sampling, seed)
                for (a, b), seed in zip(bounds, seeds)
            ]
            batch = concat_rollouts(parts, self.policy.pad_token_id)
        batch.policy_version = version
        return batch

    def close(self) -> None:
        pass


def make_rollout_backend(cfg: Config, policy: Policy, model_path: str) -> RolloutBackend:
    """The backend `rollout.backend` names; ray and vllm are imported only when chosen."""
    backend = cfg.rollout.backend
    if backend == "hf":
        return HfRollout(policy, cfg.rollout.sampling_shards)
    if backend == "ray":
        from grpo_zoo.backends.ray_workers import RayRollout

        return RayRollout(cfg, policy, model_path)
    if backend == "vllm":
        from grpo_zoo.backends.vllm_rollout import VllmRollout

        return VllmRollout(cfg, policy, model_path)
    raise ValueError(f"rollout.backend '{backend}' is unknown; use hf, ray or vllm")


def sampling_from_config(cfg: Config) -> Sampling:
    r = cfg.rollout
    return Sampling(r.group_size, r.temperature, r.top_p, r.max_new_tokens)


__all__ = [
    "HfRollout",
    "RolloutBackend",
    "Sampling",
    "concat_rollouts",
    "draw_shard_seeds",
    "make_rollout_backend",
    "sampling_from_config",
    "seeded_generate",
    "select_encoded",
    "shard_bounds",
]
