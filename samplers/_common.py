"""Shared pieces of the built-in selectors: epoch order, RNG state, feedback reductions.

Every selector keeps its randomness in explicit numpy Generators whose state goes into
`state_dict()` as plain data (dicts, lists, ints, floats, str), so a checkpoint can be written
with `torch.save` and read back with `torch.load(weights_only=True)` or JSON, and a resumed
run draws exactly what an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from grpo_zoo.types import Prompt, Question, StepFeedback

_MASK63 = (1 << 63) - 1


def seed_key(*parts: int) -> list[int]:
    """Non-negative entropy words for `np.random.default_rng` from any ints (seed, step, id, ...)."""
    return [int(p) & _MASK63 for p in parts]


def keyed_rng(*parts: int) -> np.random.Generator:
    """A Generator determined only by `parts`: stateless randomness that needs no checkpointing."""
    return np.random.default_rng(seed_key(*parts))


def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    """The Generator's bit-generator state as plain data (a fresh dict; big ints are fine)."""
    return dict(rng.bit_generator.state)


def set_rng_state(rng: np.random.Generator, state: dict[str, Any], owner: str) -> None:
    expected = rng.bit_generator.state["bit_generator"]
    if not isinstance(state, dict) or state.get("bit_generator") != expected:
        raise ValueError(f"{owner}: checkpoint RNG state is not a {expected} state; was it written by another version?")
    rng.bit_generator.state = state


def check_batch_size(owner: str, batch_size: int, pool_size: int) -> None:
    if pool_size == 0:
        raise ValueError(f"{owner}: the training pool is empty; check data.train and the dataset columns")
    if batch_size < 1:
        raise ValueError(f"{owner}: batch_size must be >= 1, got {batch_size}")
    if batch_size > pool_size:
        raise ValueError(
            f"{owner}: batch_size {batch_size} is larger than the pool ({pool_size} questions); "
            f"lower train.questions_per_step or add questions"
        )


def check_pool_length(owner: str, name: str, values: Sequence[Any], pool_size: int) -> None:
    if len(values) != pool_size:
        raise ValueError(
            f"{owner}: checkpoint '{name}' holds {len(values)} questions but this run's pool has {pool_size}; "
            f"resume with the same training data"
        )


def index_of_questions(pool: Sequence[Question]) -> dict[int, int]:
    """question_id -> position in the pool; duplicate ids are an error (state is keyed on them)."""
    index: dict[int, int] = {}
    for pos, q in enumerate(pool):
        qid = int(q.question_id)
        if qid in index:
            raise ValueError(
                f"pool: question_id {qid} appears twice (positions {index[qid]} and {pos}); ids must be unique"
            )
        index[qid] = pos
    return index


def original_prompt(q: Question, difficulty: float | None = None, **extras: Any) -> Prompt:
    """The question itself as a Prompt (images shared, not copied)."""
    return Prompt(
        question_id=int(q.question_id),
        problem=q.problem,
        answer=q.answer,
        images=list(q.images),
        variant="original",
        difficulty=difficulty,
        extras=dict(extras),
    )


class EpochOrder:
    """Walks the pool in seeded random permutations, one per epoch, B at a time.

    A batch that crosses an epoch boundary takes the rest of the old epoch and then the
    first questions of the new permutation that are not already in the batch, so one batch
    never holds a question twice (as long as B <= pool size).
    """

    def __init__(self, size: int, seed: int, shuffle: bool = True):
        self.size = size
        self.shuffle = shuffle
        self.rng = np.random.default_rng(seed_key(seed, 0x5E1EC7))
        self.epoch = 0
        self.cursor = 0
        self.order = self._new_order()

    def _new_order(self) -> np.ndarray:  # [size] int64
        if self.shuffle:
            return self.rng.permutation(self.size).astype(np.int64)
        return np.arange(self.size, dtype=np.int64)

    def next(self, k: int) -> list[int]:
        """The next k pool positions (k <= size)."""
        take = [int(i) for i in self.order[self.cursor : self.cursor + k]]
        self.cursor += len(take)
        if len(take) < k:
            self.epoch += 1
            order = self._new_order()
            taken = set(take)
            fresh = [int(i) for i in order if int(i) not in taken][: k - len(take)]
            chosen = set(fresh)
            # Move the chosen ones to the front so the rest of this epoch still visits every other question.
            self.order = np.asarray(fresh + [int(i) for i in order if int(i) not in chosen], dtype=np.int64)
            self.cursor = len(fresh)
            take += fresh
        return take

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_state(self.rng), "order": self.order.tolist(), "cursor": self.cursor, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any], owner: str) -> None:
        check_pool_length(owner, "order", state["order"], self.size)
        set_rng_state(self.rng, state["rng"], owner)
        self.order = np.asarray(state["order"], dtype=np.int64)
        self.cursor = int(state["cursor"])
        self.epoch = int(state["epoch"])


def check_feedback(owner: str, feedback: StepFeedback) -> None:
    n = feedback.prompt_index.numel()
    if feedback.rewards.shape != (n,) or feedback.accuracy.shape != (n,):
        raise ValueError(
            f"{owner}: StepFeedback.rewards {tuple(feedback.rewards.shape)} and accuracy "
            f"{tuple(feedback.accuracy.shape)} must both be [N] with N = {n} (prompt_index length)"
        )
    if n and (int(feedback.prompt_index.min()) < 0 or int(feedback.prompt_index.max()) >= len(feedback.prompts)):
        raise ValueError(f"{owner}: StepFeedback.prompt_index points outside the {len(feedback.prompts)} prompts")
    if not feedback.reward_max > 0:
        raise ValueError(f"{owner}: StepFeedback.reward_max must be > 0, got {feedback.reward_max}")


def feedback_signal(feedback: StepFeedback, signal: str) -> np.ndarray:
    """Per-response success in [0, 1], float64 [N]: accuracy, or reward / R_max (clipped)."""
    if signal == "accuracy":
        values = feedback.accuracy.detach().to(torch.float64).cpu().numpy()
    else:
        values = feedback.rewards.detach().to(torch.float64).cpu().numpy() / float(feedback.reward_max)
    return np.clip(np.nan_to_num(values, nan=0.0), 0.0, 1.0)


def per_question(
    feedback: StepFeedback, index: dict[int, int], signal: str, owner: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Global-group sums: (pool positions [Q], success sums [Q], response counts [Q]).

    All responses of a question (original and variants) are pooled, in order of first appearance.
    """
    check_feedback(owner, feedback)
    values = feedback_signal(feedback, signal)  # [N]
    prompt_pos = []
    for p in feedback.prompts:
        if int(p.question_id) not in index:
            raise ValueError(f"{owner}: feedback holds question_id {p.question_id}, which is not in the training pool")
        prompt_pos.append(index[int(p.question_id)])
    row_pos = np.asarray(prompt_pos, dtype=np.int64)[feedback.prompt_index.cpu().numpy()]  # [N]
    positions, first = np.unique(row_pos, return_index=True)
    positions = positions[np.argsort(first, kind="stable")]
    slot = {int(p): i for i, p in enumerate(positions)}
    dense = np.asarray([slot[int(p)] for p in row_pos], dtype=np.int64)
    sums = np.bincount(dense, weights=values, minlength=len(positions))
    counts = np.bincount(dense, minlength=len(positions)).astype(np.float64)
    return positions, sums, counts


# The Selector Protocol's post-rollout hooks for selectors that never filter or refill:
# assign them as methods (`filter = keep_every_prompt`) rather than repeating the bodies.
def keep_every_prompt(self: Any, feedback: StepFeedback) -> torch.Tensor:  # [B] bool
    """Keep every rolled-out prompt."""
    return torch.ones(len(feedback.prompts), dtype=torch.bool)


def no_refill(self: Any, step: int, kept_prompts: int, round: int) -> list[Prompt]:
    """One rollout round per step: never ask for more prompts."""
    return []
