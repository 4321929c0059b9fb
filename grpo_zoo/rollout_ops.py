"""Steps 2-3 of a training step: roll out, score, and let the selector filter and refill.

The engine talks to the rollout backend only through `encode` + `generate` (a request and
its RolloutBatch result), so an asynchronous backend can slot in later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from grpo_zoo.backends.rollout import HfRollout, sampling_from_config
from grpo_zoo.types import Prompt, RolloutBatch, StepFeedback

if TYPE_CHECKING:
    from grpo_zoo.run import Run


@dataclass
class ScoredBatch:
    """The responses a step trains on, with their rewards."""

    rollout: RolloutBatch
    rewards: torch.Tensor  # [N] overall reward in [0, R_max]
    accuracy: torch.Tensor  # [N] accuracy term
    shaped_rewards: torch.Tensor  # [N] rewards after reward-side shaping (DAPO overlong), for the estimator
    metrics: dict[str, float] = field(default_factory=dict)


def rollout_and_score(run: Run, prompts: list[Prompt], step: int) -> ScoredBatch:
    cfg = run.cfg
    encoded = run.policy.encode(prompts, template=cfg.data.prompt_template, system_prompt=cfg.data.system_prompt)
    backend = run.rollout_backend or HfRollout(run.policy)
    rollout = backend.generate(encoded, sampling_from_config(cfg), version=step)  # the weights of `step` updates
    answers = [prompts[i].answer for i in rollout.prompt_index.tolist()]
    result = run.rewards.score(rollout.response_texts, answers)
    shaped = result.overall
    if cfg.reward.overlong_buffer > 0:
        from grpo_zoo.algorithms.reward_shaping import overlong_penalty

        lengths = rollout.response_mask.sum(-1)
        shaped = shaped + overlong_penalty(lengths, cfg.rollout.max_new_tokens, cfg.reward.overlong_buffer)
    return ScoredBatch(rollout, result.overall, result.accuracy, shaped, reward_metrics(result.metrics))


def reward_metrics(raw: dict[str, float]) -> dict[str, float]:
    """The reward runner's counters under `reward/`, its timing under `time/`."""
    out = {}
    for key, value in raw.items():
        if key == "reward_seconds":
            out["time/reward_s"] = value
        else:
            out["reward/" + key.removeprefix("reward_")] = value
    return out


def collect_batch(run: Run, prompts: list[Prompt], step: int) -> tuple[ScoredBatch | None, dict[str, float]]:
    """Roll out `prompts`; while the selector refills (dynamic sampling), roll out more.

    Returns the kept responses (None when a filtering selector kept none) and the metrics of
    everything generated.
    """
    kept: list[ScoredBatch] = []
    kept_prompts = 0
    rounds = 0
    generated = 0
    selector_metrics: dict[str, float] = {}
    while prompts:
        scored = rollout_and_score(run, prompts, step)
        generated += scored.rollout.num_responses
        feedback = StepFeedback(
            prompts=scored.rollout.prompts,
            prompt_index=scored.rollout.prompt_index,
            rewards=scored.rewards,
            accuracy=scored.accuracy,
            reward_max=run.cfg.reward.reward_max,
            step=step,
        )
        selector_metrics = run.selector.update(feedback)
        keep = run.selector.filter(feedback)
        if bool(keep.all()):
            kept.append(scored)
        elif bool(keep.any()):
            kept.append(select_prompts(scored, keep))
        kept_prompts += int(keep.sum())
        rounds += 1
        prompts = run.selector.refill(step, kept_prompts, rounds)
    metrics = {f"selector/{k}": v for k, v in selector_metrics.items()}
    metrics.update({"rollout/generated": float(generated), "rollout/rounds": float(rounds)})
    if not kept:
        return None, metrics
    batch = kept[0] if len(kept) == 1 else concat_batches(kept)
    metrics.update(batch.metrics)
    metrics.update(batch_metrics(batch))
    return batch, metrics


def batch_metrics(batch: ScoredBatch) -> dict[str, float]:
    lengths = batch.rollout.response_mask.sum(-1).float()
    kinds: dict[str, int] = {}
    for prompt in batch.rollout.prompts:
        kinds[prompt.variant] = kinds.get(prompt.variant, 0) + 1
    metrics = {
        "reward/mean": float(batch.rewards.mean()),
        "reward/std": float(batch.rewards.std()) if batch.rewards.numel() > 1 else 0.0,
        "reward/accuracy": float(batch.accuracy.mean()),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "rollout/responses": float(batch.rollout.num_responses),
    }
    total = len(batch.rollout.prompts)
    metrics.update({f"prompts/share_{kind}": count / total for kind, count in kinds.items()})
    return metrics


def select_prompts(batch: ScoredBatch, keep: torch.Tensor) -> ScoredBatch:
    """The rows of the prompts where keep [B] is true, with prompt indices renumbered."""
    rollout = batch.rollout
    kept_ids = keep.nonzero().flatten()
    renumber = torch.full((len(rollout.prompts),), -1, dtype=torch.long)
    renumber[kept_ids] = torch.arange(len(kept_ids))
    rows = keep[rollout.prompt_index].nonzero().flatten()
    sub = RolloutBatch(
        prompts=[rollout.prompts[i] for i in kept_ids.tolist()],
        prompt_index=renumber[rollout.prompt_index[rows]],
        response_ids=rollout.response_ids[rows],
        response_mask=rollout.response_mask[rows],
        response_texts=[rollout.response_texts[i] for i in rows.tolist()],
        sampler_logprobs=rollout.sampler_logprobs[rows] if rollout.sampler_logprobs is not None else None,
        policy_version=rollout.policy_version,
        extras=_subset_extras(rollout.extras, kept_ids, rows),
    )
    return ScoredBatch(sub, batch.rewards[rows], batch.accuracy[rows], batch.shaped_rewards[rows], batch.metrics)


def concat_batches(batches: list[ScoredBatch]) -> ScoredBatch:
    rollouts = [b.rollout for b in batches]
    width = max(r.response_ids.shape[1] for r in rollouts)
    offsets = torch.tensor([0] + [len(r.prompts) for r in rollouts]).cumsum(0)
    merged = RolloutBatch(
        prompts=[p for r in rollouts for p in r.prompts],
        prompt_index=torch.cat([r.prompt_index + offsets[i] for i, r in enumerate(rollouts)]),
        response_ids=torch.cat([_pad(r.response_ids, width) for r in rollouts]),
        response_mask=torch.cat([_pad(r.response_mask, width) for r in rollouts]),
        response_texts=[t for r in rollouts for t in r.response_texts],
        sampler_logprobs=(
            torch.cat([_pad(r.sampler_logprobs, width) for r in rollouts])
            if all(r.sampler_logprobs is not None for r in rollouts)
            else None
        ),
        policy_version=rollouts[0].policy_version,
        extras=_concat_extras([r.extras for r in rollouts]),
    )
    return ScoredBatch(
        merged,
        torch.cat([b.rewards for b in batches]),
        torch.cat([b.accuracy for b in batches]),
        torch.cat([b.shaped_rewards for b in batches]),
        dict(batches[-1].metrics),
    )


def _pad(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


def _subset_extras(extras: dict, prompt_ids: torch.Tensor, rows: torch.Tensor) -> dict:
    # Convention for backend extras: keys starting with "prompt_" hold one item per prompt (lists),
    # keys starting with "row_" one item per response row (tensors or lists); others are shared.
    out = {}
    for key, value in extras.items():
        if key.startswith("prompt_"):
            out[key] = _take(value, prompt_ids)
        elif key.startswith("row_"):
            out[key] = _take(value, rows)
        else:
            out[key] = value
    return out


def _concat_extras(all_extras: list[dict]) -> dict:
    out = {}
    for key, value in all_extras[0].items():
        values = [e[key] for e in all_extras]
        if key.startswith(("prompt_", "row_")):
            out[key] = torch.cat(values) if isinstance(value, torch.Tensor) else [v for vs in values for v in vs]
        else:
            out[key] = value
    return out


def _take(value, index: torch.Tensor):
    if isinstance(value, torch.Tensor):
        return value[index]
    return [value[i] for i in index.tolist()]
