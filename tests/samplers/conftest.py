"""Stand-in pools and fake rollout feedback for the selector tests (no model, no rollout)."""

from __future__ import annotations

import io
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from grpo_zoo.state_io import load_state, save_state
from grpo_zoo.types import Prompt, Question, StepFeedback


def make_question(
    i: int, rng: np.random.Generator, image: bool = True, paraphrase: bool = True, hints: bool = True, size: int = 16
) -> Question:
    pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    a, b = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    return Question(
        question_id=i,
        problem=("<image>" if image else "") + f"How much is {a} plus {b}?",
        answer=str(a + b),
        images=[Image.fromarray(pixels)] if image else [],
        paraphrases=[f"<image>What is {a} + {b}?", f"<image>Add {a} and {b}."] if paraphrase else [],
        hint_steps=[f"Start with {a}.", f"Add {b}.", f"That gives {a + b}."] if hints else [],
    )


def build_pool(n: int = 30, seed: int = 0, **kwargs) -> list[Question]:
    rng = np.random.default_rng(seed)
    return [make_question(i, rng, **kwargs) for i in range(n)]


def build_feedback(
    prompts: list[Prompt],
    group_size: int = 4,
    seed: int = 0,
    rewards: torch.Tensor | None = None,
    step: int = 0,
    reward_max: float = 1.0,
) -> StepFeedback:
    """Seeded random 0/1 rewards per response (or the given [N] rewards); accuracy = reward / R_max."""
    n = len(prompts) * group_size
    if rewards is None:
        gen = torch.Generator().manual_seed(seed)
        rewards = torch.randint(0, 2, (n,), generator=gen).float() * reward_max
    return StepFeedback(
        prompts=prompts,
        prompt_index=torch.arange(len(prompts)).repeat_interleave(group_size),
        rewards=rewards,
        accuracy=(rewards / reward_max).clamp(0, 1),
        reward_max=reward_max,
        step=step,
    )


def through_checkpoint(state: dict) -> dict:
    """A state dict after the engine's checkpoint format (JSON + safetensors, never unpickled),
    then torch.save / torch.load(weights_only=True): proves it is plain data."""
    with tempfile.TemporaryDirectory() as tmp:
        save_state(state, tmp, "selector")
        state = load_state(tmp, "selector")
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def prompt_key(p: Prompt) -> tuple:
    """Everything a prompt carries, images as bytes, for exact comparisons."""
    images = tuple(im.tobytes() for im in p.images)
    return (p.question_id, p.problem, p.answer, p.variant, p.difficulty, images, repr(sorted(p.extras.items())))


@pytest.fixture
def fakes() -> SimpleNamespace:
    """The helpers above, as one fixture (tests run with --import-mode=importlib: no sibling imports)."""
    return SimpleNamespace(
        question=make_question,
        pool=build_pool,
        feedback=build_feedback,
        through_checkpoint=through_checkpoint,
        prompt_key=prompt_key,
    )
