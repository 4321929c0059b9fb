"""Held-out evaluation: sampled pass@1 (the main metric), pass@k and greedy accuracy.

The eval draws from its own seeded RNG and restores the global one afterwards, so how often
a run evaluates never changes what it trains on (resume stays bit-identical).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from math import comb
from typing import Any

import torch

from grpo_zoo.slice_keys import slice_key
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
    by: tuple[str, ...] = ()  # question columns (extras) to break pass@1 and greedy accuracy down by


def settings_from_config(cfg: Any) -> EvalSettings:
    """A recipe's eval settings: eval.* sizes, the rollout's sampling, the data's prompt template."""
    return EvalSettings(
        samples=cfg.eval.samples,
        greedy=cfg.eval.greedy,
        batch_size=cfg.eval.batch_size,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        max_new_tokens=cfg.rollout.max_new_tokens,
        template=cfg.data.prompt_template,
        system_prompt=cfg.data.system_prompt,
        by=tuple(cfg.eval.by),
    )


def as_prompts(questions: list[Question]) -> list[Prompt]:
    return [Prompt(q.question_id, q.problem, q.answer, list(q.images), extras=dict(q.extras)) for q in questions]


def evaluate(policy, questions: list[Question], rewards, settings: EvalSettings) -> dict[str, float]:
    """Score `policy` on `questions` with the training reward's accuracy and format terms."""
    rng_state = torch.get_rng_state()
    torch.manual_seed(settings.seed)
    prompts = as_prompts(questions)
    metrics: dict[str, float] = {}
    per_question: dict[str, torch.Tensor] = {}  # metric name -> [P] per-question score, for the breakdowns
    try:
        with torch.no_grad():
            if settings.greedy:
                acc, fmt, length = _score(policy, prompts, rewards, settings, group_size=1, greedy=True)
                metrics["eval/greedy_accuracy"] = float(acc.mean())
                per_question["greedy_accuracy"] = acc.float()
            if settings.samples > 0:
                acc, fmt, length = _score(policy, prompts, rewards, settings, group_size=settings.samples, greedy=False)
                correct = (acc >= 0.5).view(len(prompts), settings.samples)
                metrics["eval/pass@1"] = float(correct.float().mean())
                per_question["pass@1"] = correct.float().mean(1)
                k = settings.samples
                metrics[f"eval/pass@{k}"] = sum(pass_at_k(k, int(c), k) for c in correct.sum(1)) / len(prompts)
            metrics["eval/format"] = float(fmt.mean())
            metrics["eval/response_length"] = float(length.mean())
    finally:
        torch.set_rng_state(rng_state)
    for column in settings.by:
        metrics.update(slice_metrics(prompts, column, per_question))
    return metrics


def column_values(prompts: list[Prompt], column: str) -> dict[str, list[int]]:
    """Prompt indices per value of the question column `column`, in value order.

    Values are named by str(value), "None" where absent, with "/" written "_" (it separates a metric name's parts).
    """
    groups: dict[Any, list[int]] = {}
    for i, p in enumerate(prompts):
        value = p.extras.get(column)
        groups.setdefault(value if isinstance(value, (int, float, str, type(None))) else str(value), []).append(i)
    return {str(v).replace("/", "_"): groups[v] for v in value_order(groups)}


def slice_metrics(prompts: list[Prompt], column: str, per_question: dict[str, torch.Tensor]) -> dict[str, float]:
    """eval/<column>=<value>/<metric>: each per-question metric averaged over the questions of each value."""
    out: dict[str, float] = {}
    for value, index in column_values(prompts, column).items():
        rows = torch.tensor(index, dtype=torch.long)
        for name, scores in per_question.items():
            out[slice_key(column, value, name)] = float(scores[rows].mean())
    return out


def _score(policy, prompts: list[Prompt], rewards, settings: EvalSettings, *, group_size: int, greedy: bool):
    scores = score_responses(policy, prompts, rewards, settings, group_size=group_size, greedy=greedy)
    fmt = scores.format if scores.format is not None else torch.zeros_like(scores.accuracy)
    return scores.accuracy, fmt, scores.length


@dataclass
class ResponseScores:
    """Per-response outcome of `score_responses`, rows prompt-major (N = rendered prompts x G)."""

    prompt_index: torch.Tensor  # [N] long, index into the prompts passed in
    accuracy: torch.Tensor  # [N] float, the reward's accuracy term
    format: torch.Tensor | None  # [N] float, the reward's "format" term; None when the recipe has none
    length: torch.Tensor  # [N] float, response tokens (EOS included)
    texts: list[str]  # [N]
    reward_failures: int = 0  # reward calls that raised or timed out (scored 0 by the runner)
    unrendered: dict[int, str] = field(default_factory=dict)  # prompt index -> why it could not be encoded


def score_responses(policy, prompts: list[Prompt], rewards, settings: EvalSettings, *, group_size: int,
                    greedy: bool, skip_unrenderable: bool = False,
                    on_batch: Callable[[int], object] | None = None) -> ResponseScores:
    """Generate `group_size` responses per prompt in batches and score them with `rewards`.

    Batches hold ~settings.batch_size sequences. Sampling draws from torch's global RNG (the
    caller seeds it). skip_unrenderable: a prompt the policy cannot encode (an <image> tag
    without its image, images for a text-only model) is left out and its reason recorded in
    `unrendered`, instead of raising. on_batch(n) is called with each batch's sequence count
    (a progress bar).
    """
    parts: list[tuple[torch.Tensor, object, torch.Tensor, list[str]]] = []
    unrendered: dict[int, str] = {}
    failures = 0
    per_batch = max(1, settings.batch_size // group_size)
    for start in range(0, len(prompts), per_batch):
        index = list(range(start, min(start + per_batch, len(prompts))))
        encoded, index = _encode(policy, prompts, index, settings, unrendered if skip_unrenderable else None)
        if encoded is None:
            continue
        rollout = policy.generate(encoded, group_size=group_size, temperature=settings.temperature,
                                  top_p=settings.top_p, max_new_tokens=settings.max_new_tokens, greedy=greedy)
        rows = rollout.prompt_index.tolist()
        result = rewards.score(rollout.response_texts, [prompts[index[i]].answer for i in rows])
        failures += int(result.errors) + int(result.timeouts)
        global_index = torch.tensor([index[i] for i in rows], dtype=torch.long)  # [n]
        parts.append((global_index, result, rollout.response_mask.sum(-1).float(), rollout.response_texts))
        if on_batch is not None:
            on_batch(len(rows))
    if not parts:
        empty = torch.zeros(0)
        return ResponseScores(torch.zeros(0, dtype=torch.long), empty, empty, empty, [], 0, unrendered)
    has_format = all("format" in result.per_function for _, result, _, _ in parts)
    return ResponseScores(
        prompt_index=torch.cat([p[0] for p in parts]),
        accuracy=torch.cat([p[1].accuracy for p in parts]),
        format=torch.cat([p[1].per_function["format"] for p in parts]) if has_format else None,
        length=torch.cat([p[2] for p in parts]),
        texts=[t for p in parts for t in p[3]],
        reward_failures=failures,
        unrendered=unrendered,
    )


def _encode(policy, prompts: list[Prompt], index: list[int], settings: EvalSettings,
            unrendered: dict[int, str] | None):
    """Encode prompts[index]; with `unrendered`, retry one by one after a failure and drop the bad ones."""
    kwargs = {"template": settings.template, "system_prompt": settings.system_prompt}
    try:
        return policy.encode([prompts[i] for i in index], **kwargs), index
    except ValueError:
        if unrendered is None:
            raise
    kept = []
    for i in index:
        try:
            policy.encode([prompts[i]], **kwargs)
            kept.append(i)
        except ValueError as exc:
            unrendered[i] = str(exc)
    if not kept:
        return None, []
    return policy.encode([prompts[i] for i in kept], **kwargs), kept


# ---------------------------------------------------------------------------------------
# Per-question results and their aggregation (grpo-zoo eval: pass@k, mean@k, breakdowns)
# ---------------------------------------------------------------------------------------


@dataclass
class QuestionResult:
    """What one question scored: its greedy and sampled correctness and every response's format and length."""

    question_id: int
    columns: dict[str, Any]  # the dataset columns a breakdown groups by
    greedy: int | None  # 1 if the greedy response is correct (accuracy >= 0.5), None without a greedy pass
    correct: list[int]  # [n] 1 per correct sampled response
    format: list[float]  # [greedy + n] format reward of each response, greedy first
    length: list[float]  # [greedy + n] tokens of each response, greedy first


def summarise(results: list[QuestionResult], samples: int, ks: list[int]) -> dict[str, float | int | None]:
    """Aggregate per-question results into the eval figures.

    greedy_accuracy: mean over questions of the greedy correctness.
    mean@n: mean over questions of c_i / n, the mean accuracy of the n sampled responses (the
        sampled pass@1 the trainer logs as eval/pass@1).
    pass@k: mean over questions of the unbiased estimator 1 - C(n - c_i, k) / C(n, k) (Chen et
        al. 2021), for each k in `ks` (k <= n).
    format, response_length: means over every response, greedy and sampled alike.
    An empty list gives None for every figure (no NaN).
    """
    out: dict[str, float | int | None] = {"questions": len(results)}
    greedy = [r.greedy for r in results if r.greedy is not None]
    out["greedy_accuracy"] = sum(greedy) / len(greedy) if greedy else None
    if samples > 0:
        out[f"mean@{samples}"] = _mean([sum(r.correct) / samples for r in results])
        for k in ks:
            out[f"pass@{k}"] = _mean([pass_at_k(samples, sum(r.correct), k) for r in results])
    out["format"] = _mean([f for r in results for f in r.format])
    out["response_length"] = _mean([n for r in results for n in r.length])
    return out


def breakdown(results: list[QuestionResult], column: str, samples: int, ks: list[int]) -> list[dict[str, Any]]:
    """`summarise` per value of `column`, one row {"value": v, **figures} each, ordered by value.

    Questions without the column are grouped under the value None.
    """
    groups: dict[Any, list[QuestionResult]] = {}
    for r in results:
        groups.setdefault(r.columns.get(column), []).append(r)
    return [{"value": v, **summarise(groups[v], samples, ks)} for v in value_order(groups)]


def value_order(values: Iterable[Any]) -> list[Any]:
    """A column's values in reading order: numbers ascending, then strings, then None."""
    return sorted(values, key=lambda v: (v is None, isinstance(v, str), v if not isinstance(v, str) else 0, str(v)))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
