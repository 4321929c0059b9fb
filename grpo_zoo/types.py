"""Typed contracts between the stages of a training step.

Shape letters: B prompts, G responses per prompt, N = B * G responses, T response tokens.
Every stage talks to the next through one of these dataclasses; none of them holds logic
beyond validation, so a plug-in can be written and tested against them alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from PIL import Image

# --------------------------------------------------------------------------------------
# Data: what a dataset row becomes, and what a selector hands to the rollout.
# --------------------------------------------------------------------------------------


@dataclass
class Question:
    """One training question (a dataset row), before any variant is built.

    `paraphrases` and `hint_steps` are the offline variant material DIVA reads from dataset
    columns; either may be empty, and the selector then falls back to another variant kind.
    """

    question_id: int  # stable index in the pool; per-question state is keyed on it
    problem: str  # prompt text; `<image>` marks where each image goes
    answer: str  # ground truth, compared by the reward functions
    images: list[Image.Image] = field(default_factory=list)
    paraphrases: list[str] = field(default_factory=list)
    hint_steps: list[str] = field(default_factory=list)  # the solution as ordered steps
    extras: dict[str, Any] = field(default_factory=dict)  # any other column (subject, ...)


@dataclass
class Prompt:
    """One prompt to roll out G times: a question itself or one of its variants.

    Every response of one Prompt forms a *local group*; every response of every Prompt with
    the same `question_id` forms the *global group*.
    """

    question_id: int
    problem: str
    answer: str
    images: list[Image.Image] = field(default_factory=list)
    variant: str = "original"  # "original", "paraphrase", "hint", "perturb", "only_vision", ...
    difficulty: float | None = None  # the difficulty label D_i (DIVA); None when untracked
    extras: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# Rollout: what the backend returns and what selectors learn from.
# --------------------------------------------------------------------------------------


@dataclass
class RolloutBatch:
    """G sampled responses for each of B prompts, flattened to N = B * G rows.

    Rows are ordered prompt by prompt: row i belongs to prompts[prompt_index[i]].
    `policy_version` and `sampler_logprobs` let an asynchronous backend (one step
    off-policy) and rollout correction plug in later without changing this contract.
    """

    prompts: list[Prompt]
    prompt_index: torch.Tensor  # [N] long, index into prompts
    response_ids: torch.Tensor  # [N, T] long, right-padded
    response_mask: torch.Tensor  # [N, T] float, 1 on real response tokens
    response_texts: list[str]  # [N]
    sampler_logprobs: torch.Tensor | None = None  # [N, T] log-probs the sampler reported
    policy_version: int = 0  # optimizer steps the sampling weights had taken
    extras: dict[str, Any] = field(default_factory=dict)  # backend-specific tensors

    @property
    def num_responses(self) -> int:
        return int(self.prompt_index.numel())


@dataclass
class StepFeedback:
    """What a selector sees after a rollout has been scored (its `update` input)."""

    prompts: list[Prompt]  # [B]
    prompt_index: torch.Tensor  # [N] long, index into prompts
    rewards: torch.Tensor  # [N] float, overall reward in [0, R_max]
    accuracy: torch.Tensor  # [N] float, the accuracy term alone, in [0, 1]
    reward_max: float = 1.0
    step: int = 0

    @property
    def question_ids(self) -> torch.Tensor:  # [N] long
        qids = torch.tensor([p.question_id for p in self.prompts], dtype=torch.long)
        return qids[self.prompt_index]


# --------------------------------------------------------------------------------------
# Advantage estimators.
# --------------------------------------------------------------------------------------


@dataclass
class AdvantageInputs:
    """Everything an advantage estimator may read. Pure data; built once per step."""

    rewards: torch.Tensor  # [N] float
    prompt_ids: torch.Tensor  # [N] long, local group (one id per prompt)
    question_ids: torch.Tensor  # [N] long, global group (one id per question)
    response_mask: torch.Tensor  # [N, T] float or bool
    difficulty: torch.Tensor | None = None  # [N] float, D_i of the row's prompt (DIVA)
    seq_logprob: torch.Tensor | None = None  # [N] float, summed response log-prob (Durian)
    visual_entropy: torch.Tensor | None = None  # [N] float, H(image) of the prompt (Durian)
    extras: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_advantage_inputs(self)

    @property
    def num_responses(self) -> int:
        return int(self.rewards.numel())

    @property
    def response_lengths(self) -> torch.Tensor:  # [N] float
        return self.response_mask.float().sum(dim=-1)


@dataclass
class AdvantageOutput:
    advantages: torch.Tensor  # [N] float, one per response; the engine broadcasts over T
    metrics: dict[str, float] = field(default_factory=dict)


def validate_advantage_inputs(inputs: AdvantageInputs) -> None:
    """Raise a ValueError naming the field for any input an estimator must not see."""
    rewards = inputs.rewards
    if rewards.dim() != 1:
        raise ValueError(f"AdvantageInputs.rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    n = rewards.numel()
    if n == 0:
        raise ValueError("AdvantageInputs.rewards is empty: an estimator needs at least one response")
    if not torch.isfinite(rewards).all():
        bad = int((~torch.isfinite(rewards)).sum())
        raise ValueError(f"AdvantageInputs.rewards has {bad} NaN/inf value(s); fix the reward function")
    for name in ("prompt_ids", "question_ids"):
        ids = getattr(inputs, name)
        if ids.shape != (n,):
            raise ValueError(f"AdvantageInputs.{name} must have shape ({n},) like rewards, got {tuple(ids.shape)}")
    if inputs.response_mask.dim() != 2 or inputs.response_mask.shape[0] != n:
        raise ValueError(
            f"AdvantageInputs.response_mask must be [N, T] with N = {n}, got {tuple(inputs.response_mask.shape)}"
        )
    for name in ("difficulty", "seq_logprob", "visual_entropy"):
        value = getattr(inputs, name)
        if value is None:
            continue
        if value.shape != (n,):
            raise ValueError(f"AdvantageInputs.{name} must have shape ({n},), got {tuple(value.shape)}")
        if not torch.isfinite(value).all():
            raise ValueError(f"AdvantageInputs.{name} has NaN/inf values")


def broadcast_advantages(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[N] advantages -> [N, T] token advantages, zero on padding."""
    return advantages.unsqueeze(-1) * response_mask.to(advantages.dtype)


# --------------------------------------------------------------------------------------
# Policy losses.
# --------------------------------------------------------------------------------------


@dataclass
class LossInputs:
    """One mini-batch of per-token log-probs for a policy loss."""

    logp: torch.Tensor  # [N, T] current policy log-probs of the response tokens (grad flows)
    old_logp: torch.Tensor  # [N, T] log-probs under the policy that sampled (no grad)
    advantages: torch.Tensor  # [N] one advantage per response
    mask: torch.Tensor  # [N, T] float, 1 on real response tokens
    ref_logp: torch.Tensor | None = None  # [N, T] reference policy log-probs, when KL is on
    sampler_logp: torch.Tensor | None = None  # [N, T] external sampler log-probs (rollout correction)
    kl_coef: float = 0.0  # beta; 0 turns the KL term off
    kl_estimator: str = "k3"  # "k1" or "k3"
    max_response_length: int = 0  # for seq-mean-token-sum-norm (Dr.GRPO); 0 = use T
    seed: int = 0  # for losses that pick tokens at random (clip_cov)


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    metrics: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# Sample selectors.
# --------------------------------------------------------------------------------------


class Selector(Protocol):
    """Picks the prompts of each step and learns from the scored rollouts.

    Constructed as `cls(pool, config, batch_size=B, seed=s)` where `pool` is the indexable
    sequence of training Questions. The engine calls, per step:
        prompts = select(step)                      # B questions, variants included
        loop:  roll out + score -> feedback
               metrics = update(feedback)           # every rolled-out response, kept or not
               keep = filter(feedback)              # [len(feedback.prompts)] bool
               prompts = refill(step, kept, round)  # more prompts, or [] when the batch is done
    """

    def select(self, step: int) -> list[Prompt]: ...

    def update(self, feedback: StepFeedback) -> dict[str, float]: ...

    def filter(self, feedback: StepFeedback) -> torch.Tensor: ...  # [B] bool, prompts to keep

    def refill(self, step: int, kept_prompts: int, round: int) -> list[Prompt]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def histograms(self) -> dict[str, Any]: ...  # name -> 1-D numpy array, for TensorBoard
