"""Held-out evaluation: sampled pass@1 (the main metric), pass@k and greedy accuracy.

The eval draws from its own seeded RNG and restores the global one afterwards, so how often
a run evaluates never changes what it trains on (resume stays bit-identical).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

import torch

from grpo_zoo.types import Prompt, Question


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n < k:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class EvalSettings:
    samples: int = 4
    greedy: bool = True
    batch_size: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    template: str = "{problem}"
    system_prompt: str = ""
    seed: int = 1234


def as_prompts(questions: list[Question]) -> list[Prompt]:
    return [Prompt(q.question_id, q.problem, q.answer, list(q.images), extras=dict(q.extras)) for q in questions]


def evaluate(policy, questions: list[Question], rewards, settings: EvalSettings) -> dict[str, float]:
    """Score `policy` on `questions` with the training reward's accuracy and format terms."""
    rng_state = torch.get_rng_state()
    torch.manual_seed(settings.seed)
    prompts = as_prompts(questions)
    metrics: dict[str, float] = {}
    try:
        with torch.no_grad():
            if settings.greedy:
                acc, fmt, length = _score(policy, prompts, rewards, settings, group_size=1, greedy=True)
                metrics["eval/greedy_accuracy"] = float(acc.mean())
            if settings.samples > 0:
                acc, fmt, length = _score(policy, prompts, rewards, settings, group_size=settings.samples, greedy=False)
                correct = (acc >= 0.5).view(len(prompts), settings.samples)
                metrics["eval/pass@1"] = float(correct.float().mean())
                k = settings.samples
                metrics[f"eval/pass@{k}"] = sum(pass_at_k(k, int(c), k) for c in correct.sum(1)) / len(prompts)
            metrics["eval/format"] = float(fmt.mean())
            metrics["eval/response_length"] = float(length.mean())
    finally:
        torch.set_rng_state(rng_state)
    return metrics


def _score(policy, prompts: list[Prompt], rewards, settings: EvalSettings, *, group_size: int, greedy: bool):
    accs, fmts, lengths = [], [], []
    per_batch = max(1, settings.batch_size // group_size)
    for start in range(0, len(prompts), per_batch):
        chunk = prompts[start : start + per_batch]
        encoded = policy.encode(chunk, template=settings.template, system_prompt=settings.system_prompt)
        rollout = policy.generate(
            encoded,
            group_size=group_size,
            temperature=settings.temperature,
            top_p=settings.top_p,
            max_new_tokens=settings.max_new_tokens,
            greedy=greedy,
        )
        answers = [chunk[i].answer for i in rollout.prompt_index.tolist()]
        result = rewards.score(rollout.response_texts, answers)
        accs.append(result.accuracy)
        fmts.append(result.per_function.get("format", torch.zeros_like(result.accuracy)))
        lengths.append(rollout.response_mask.sum(-1))
    return torch.cat(accs), torch.cat(fmts), torch.cat(lengths).float()
