"""`grpo-zoo eval`: score one or more models on held-out datasets with training's template and verifier.

For each model (an HF directory, a grpo_zoo run or checkpoint, or `testbed`) and each dataset
(a parquet/jsonl/arrow file or directory, or `testbed` = the testbed's held-out split), every
question gets one greedy response and n sampled ones, rendered with the recipe's prompt
template and scored by the recipe's reward (the accuracy term decides correctness, >= 0.5).
Figures (grpo_zoo.evaluation.summarise): greedy accuracy, mean@n, unbiased pass@k, format
compliance (the recipe's "format" reward, or the built-in one when the recipe has none), mean
response length; the same per value of any dataset column (--by).

The recipe: --config, else the config.yaml of the first model that is a grpo_zoo run (so its
template and reward are the ones it trained with), else the default recipe. One recipe serves
every model, so a comparison table differs only in the weights; models from runs with another
template or reward get a warning.

Rows never vanish silently: rows the loader cannot read (grpo_zoo.data) and questions the model
cannot render are counted per reason and listed; reward calls that fail are counted (scored 0).
Sampling is seeded (--seed) before every (model, dataset), so every model sees the same random
stream, and the caller's RNG is restored afterwards.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from grpo_zoo.config import Config, load_config
from grpo_zoo.data import load_questions
from grpo_zoo.evaluate.report import EvalResult
from grpo_zoo.evaluate.sources import Source, parse_sources, pick_recipe, recipe_warnings
from grpo_zoo.evaluation import (
    EvalSettings,
    QuestionResult,
    as_prompts,
    breakdown,
    score_responses,
    settings_from_config,
    summarise,
)
from grpo_zoo.types import Question

SCALARS = (str, int, float, bool)


@dataclass
class EvalOptions:
    """The flags of `grpo-zoo eval`; 0 / None means "the recipe's value"."""

    samples: int = -1  # n sampled responses per question (mean@n, pass@k); -1 = the recipe's eval.samples; 0 = none
    ks: list[int] | None = None  # pass@k for each k <= n; None = [n] (nothing when n <= 1)
    greedy: bool = True  # one greedy response per question (greedy accuracy)
    by: list[str] = field(default_factory=list)  # dataset columns to break the figures down by
    batch_size: int = 0  # sequences per generate call; 0 = eval.batch_size
    max_new_tokens: int = 0  # 0 = rollout.max_new_tokens (responses are cut and scored as in training)
    temperature: float | None = None  # None = rollout.temperature
    top_p: float | None = None  # None = rollout.top_p
    limit: int = 0  # the first `limit` questions of each dataset; 0 = all
    seed: int = 1234  # sampling seed, the same for every model and dataset
    backend: str = ""  # "hf" | "vllm" | "auto" (vllm on a GPU where installed); "" = rollout.backend
    chat_template: str | None = None  # a Jinja file or text; "none" = plain text; None = the model's own
    progress: bool = True  # a tqdm bar over the sequences

    def check(self) -> None:
        sizes = {"samples": self.samples + 1, "batch_size": self.batch_size, "max_new_tokens": self.max_new_tokens,
                 "limit": self.limit}
        bad = next((name for name, value in sizes.items() if value < 0), None)
        if bad:
            raise ValueError(f"eval: --{bad.replace('_', '-')} must be >= 0 (0 = the recipe's value)")
        if self.backend not in ("", "hf", "vllm", "auto"):
            raise ValueError(f"eval: --backend must be hf, vllm or auto, got {self.backend!r}")
        if self.ks is not None and any(k < 1 for k in self.ks):
            raise ValueError(f"eval: every k of --k must be >= 1, got {self.ks}")


def eval_settings(cfg: Config, opts: EvalOptions) -> tuple[EvalSettings, list[int]]:
    """The recipe's eval settings with the flags applied, and the pass@k values to report."""
    base = settings_from_config(cfg)
    samples = cfg.eval.samples if opts.samples < 0 else opts.samples
    ks = sorted(set(opts.ks)) if opts.ks is not None else ([samples] if samples > 1 else [])
    if any(k > samples for k in ks):
        raise ValueError(f"eval: pass@k needs k <= the samples per question; got --k {ks} with --samples {samples}")
    if not opts.greedy and samples == 0:
        raise ValueError("eval: nothing to evaluate: --no-greedy with --samples 0")
    settings = dataclasses.replace(
        base, samples=samples, greedy=opts.greedy, seed=opts.seed,
        batch_size=opts.batch_size or base.batch_size,
        max_new_tokens=opts.max_new_tokens or base.max_new_tokens,
        temperature=base.temperature if opts.temperature is None else opts.temperature,
        top_p=base.top_p if opts.top_p is None else opts.top_p,
    )
    if "{problem}" not in settings.template:
        raise ValueError(f"data.prompt_template must contain '{{problem}}', got {settings.template!r}")
    return settings, ks


# ---------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------


def pick_backend(cfg: Config, opts: EvalOptions) -> str:
    """hf or vllm: --backend, else rollout.backend (ray samples with hf copies: hf here); `auto` is
    vllm on a GPU where vllm is installed, else hf."""
    name = opts.backend or cfg.rollout.backend
    if name == "auto":
        from grpo_zoo.backends.vllm_rollout import vllm_available

        return "vllm" if torch.cuda.is_available() and vllm_available() else "hf"
    return "hf" if name == "ray" else name


def load_policy(path: str, cfg: Config, backend: str) -> Any:
    """An object with Policy's encode/generate for the model directory `path`, generating with `backend`."""
    from grpo_zoo.policy import Policy
    from grpo_zoo.run import pick_device

    if backend != "vllm":
        return Policy.from_pretrained(path, device=pick_device(cfg.model.device), dtype=cfg.model.dtype)
    from grpo_zoo.backends.vllm_rollout import VllmRollout, vllm_available

    if not vllm_available():
        raise ValueError("rollout.backend = vllm, but vllm is not installed: install it on a GPU machine "
                         "(pip install -e .[vllm]), or pass --backend hf")
    # The HF copy only renders prompts and decodes (the engine holds the weights): it stays on the CPU.
    policy = Policy.from_pretrained(path, device="cpu", dtype=cfg.model.dtype)
    cfg = copy.deepcopy(cfg)
    cfg.rollout.vllm.sleep_level = 0  # nothing trains between calls: sleeping would only add wake-ups
    engine = VllmRollout(cfg, policy, path)
    engine.version = 0  # it loaded the checkpoint itself: nothing to sync from the CPU copy
    return BackendPolicy(policy, engine)


class BackendPolicy:
    """Policy's encode/generate over a rollout backend (grpo_zoo.backends): prompts are rendered by
    the HF processor exactly as in training, responses come from the backend; greedy is
    temperature 0 (what vLLM reads as argmax)."""

    def __init__(self, policy: Any, backend: Any):
        self.policy, self.backend = policy, backend
        self.processor, self.tokenizer = policy.processor, policy.tokenizer

    def encode(self, prompts: list, **kwargs: Any) -> Any:
        return self.policy.encode(prompts, **kwargs)

    def generate(self, encoded: Any, *, group_size: int, temperature: float, top_p: float, max_new_tokens: int,
                 greedy: bool = False) -> Any:
        from grpo_zoo.backends.rollout import Sampling

        sampling = Sampling(group_size, 0.0 if greedy else temperature, 1.0 if greedy else top_p, max_new_tokens)
        return self.backend.generate(encoded, sampling, version=0)

    def close(self) -> None:
        self.backend.close()


def apply_chat_template(policy: Any, template: str | None, label: str) -> None:
    """Give the policy --chat-template, or check it has its own chat template.

    Training renders a model without a chat template as plain text; eval refuses to guess, so
    a base model evaluated with chat turns it never saw, or the reverse, is always a choice.
    """
    owners = [o for o in (getattr(policy, "processor", None), getattr(policy, "tokenizer", None)) if o is not None]
    if template is None:
        if any(getattr(o, "chat_template", None) for o in owners):
            return
        raise ValueError(f"model '{label}' has no chat template: pass --chat-template FILE (a Jinja chat "
                         "template, e.g. the one of the instruct model it came from) or --chat-template none to "
                         "prompt with plain text (system prompt + data.prompt_template), as training did")
    if template == "none":
        text = None
    elif "{%" in template or "{{" in template:
        text = template
    elif Path(template).expanduser().is_file():
        text = Path(template).expanduser().read_text()
    else:
        raise ValueError(f"--chat-template {template!r} is neither a file, nor Jinja text, nor 'none'")
    for owner in owners:
        owner.chat_template = text


# ---------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------


def column_value(question: Question, column: str) -> Any:
    """A dataset column's value for grouping: scalars as they are, anything else as short text."""
    value = question.extras.get(column)
    return value if value is None or isinstance(value, SCALARS) else str(value)[:60]


def check_columns(datasets: dict[str, list[Question]], by: list[str]) -> list[str]:
    """Raise for a column no dataset has; warn (returned) for one missing from some datasets."""
    warnings = []
    for column in by:
        missing = [name for name, qs in datasets.items() if not any(column in q.extras for q in qs)]
        if len(missing) == len(datasets):
            known = sorted({k for qs in datasets.values() for q in qs for k, v in q.extras.items()
                            if v is None or isinstance(v, SCALARS)})
            raise ValueError(f"eval: --by {column!r} is not a column of any dataset; columns: {known}")
        warnings += [f"dataset '{name}' has no column {column!r}: its breakdown is one row (None)" for name in missing]
    return warnings


def score_dataset(policy: Any, questions: list[Question], rewards: Any, settings: EvalSettings, ks: list[int],
                  by: list[str], bar: Any = None) -> dict[str, Any]:
    """One model on one dataset: per-question results, figures, breakdowns and failures.

    A question the policy cannot render is left out of every figure and listed under "failed"
    with its reason; reward calls that raised or timed out are counted in "verify_failures".
    """
    prompts = as_prompts(questions)
    update = bar.update if bar is not None else None
    greedy = samp = None
    if settings.greedy:
        greedy = score_responses(policy, prompts, rewards, settings, group_size=1, greedy=True,
                                 skip_unrenderable=True, on_batch=update)
    if settings.samples > 0:
        torch.manual_seed(settings.seed)
        samp = score_responses(policy, prompts, rewards, settings, group_size=settings.samples, greedy=False,
                               skip_unrenderable=True, on_batch=update)
    passes = [s for s in (greedy, samp) if s is not None]
    unrendered = {i: why for s in passes for i, why in s.unrendered.items()}
    greedy_rows = _rows_by_prompt(greedy) if greedy is not None else {}
    sampled_rows = _rows_by_prompt(samp) if samp is not None else {}
    results = []
    for i, q in enumerate(questions):
        if i in unrendered:
            continue
        g, sampled = greedy_rows.get(i, []), sampled_rows.get(i, [])
        results.append(QuestionResult(
            question_id=int(q.question_id), columns={c: column_value(q, c) for c in by},
            greedy=int(g[0][0] >= 0.5) if g else None, correct=[int(a >= 0.5) for a, _, _ in sampled],
            format=[f for _, f, _ in g + sampled], length=[n for _, _, n in g + sampled],
        ))
    failed = [{"question_id": int(questions[i].question_id), "reason": why} for i, why in sorted(unrendered.items())]
    reasons: dict[str, int] = {}
    for item in failed:
        reason = re.sub(r"^question -?\d+: ", "", item["reason"])[:160]
        reasons[reason] = reasons.get(reason, 0) + 1
    return {
        "figures": summarise(results, settings.samples, ks),
        "by": {c: breakdown(results, c, settings.samples, ks) for c in by},
        "failed": failed, "failure_reasons": reasons, "verify_failures": sum(s.reward_failures for s in passes),
        "questions": [dataclasses.asdict(r) for r in results],
    }


def _rows_by_prompt(scores: Any) -> dict[int, list[tuple[float, float, float]]]:
    """prompt index -> [(accuracy, format, length)] of its responses, in row order."""
    from grpo_zoo.rewards import format_reward

    fmt = scores.format.tolist() if scores.format is not None else [format_reward(t, "") for t in scores.texts]
    out: dict[int, list[tuple[float, float, float]]] = {}
    for i, a, f, n in zip(scores.prompt_index.tolist(), scores.accuracy.tolist(), fmt, scores.length.tolist()):
        out.setdefault(i, []).append((a, float(f), n))
    return out


# ---------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------


def load_datasets(sources: list[Source], cfg: Config, limit: int) -> tuple[dict[str, list[Question]], list[dict]]:
    """Each dataset's questions (the first `limit`) and what its loader skipped, per reason."""
    datasets, loads = {}, []
    for src in sources:
        questions, report = load_questions(src.path, cfg.data, cfg.testbed, "eval")
        datasets[src.label] = questions[:limit] if limit else questions
        loads.append({"label": src.label, "source": src.path, "rows": report.rows,
                      "questions": len(datasets[src.label]), "skipped_rows": report.skipped,
                      "skip_reasons": dict(report.reasons)})
    return datasets, loads


def run_eval(models: list[str], data: list[str] | None = None, *, config: str | None = None,
             overrides: list[str] | None = None, options: EvalOptions | None = None,
             default_recipe: Path | None = None) -> EvalResult:
    """Evaluate every model on every dataset (see the module docstring); returns the EvalResult.

    models / data: `PATH` or `LABEL=PATH` each; data None = the recipe's data.eval.
    Raises ConfigError / ValueError for a bad path, dataset, column or setting, before any
    model generates.
    """
    from grpo_zoo.audit import resolve_model
    from grpo_zoo.reward_runner import RewardRunner

    started = time.monotonic()
    opts = options or EvalOptions()
    opts.check()
    model_sources = parse_sources(models, "model")
    if not model_sources:
        raise ValueError("eval: give at least one --model")
    if default_recipe is None:
        from grpo_zoo.cli import default_recipe as packaged

        default_recipe = packaged()
    recipe, runs = pick_recipe(model_sources, config, default_recipe)
    cfg = load_config(recipe, overrides or [])
    warnings = recipe_warnings(cfg, [r for r in runs if r != recipe], overrides or [])
    settings, ks = eval_settings(cfg, opts)
    datasets, loads = load_datasets(parse_sources(data or [cfg.data.eval], "data"), cfg, opts.limit)
    warnings += [f"dataset '{d['label']}': {d['skipped_rows']} of {d['rows']} rows could not be read and are not "
                 f"evaluated: {d['skip_reasons']}" for d in loads if d["skipped_rows"]]
    warnings += check_columns(datasets, opts.by)
    backend = pick_backend(cfg, opts)
    result = EvalResult(
        recipe=str(recipe), models=[], datasets=loads, blocks={}, warnings=warnings,
        settings={**dataclasses.asdict(settings), "ks": ks, "by": list(opts.by), "backend": backend,
                  "chat_template": opts.chat_template, "limit": opts.limit,
                  "reward": [[f.name, f.weight] for f in cfg.reward.functions],
                  "accuracy_function": cfg.reward.accuracy_function},
    )
    rng_state = torch.get_rng_state()
    try:
        with RewardRunner.from_config(cfg.reward) as rewards, _progress(opts, settings, model_sources, datasets) as bar:
            for source in model_sources:
                path = resolve_model(cfg, source.path)
                policy = load_policy(path, cfg, backend)
                apply_chat_template(policy, opts.chat_template, source.label)
                result.models.append({"label": source.label, "model": source.path, "path": path})
                for name, questions in datasets.items():
                    bar.set_postfix_str(f"{source.label} | {name}")
                    block = score_dataset(policy, questions, rewards, settings, ks, opts.by, bar)
                    result.blocks.setdefault(source.label, {})[name] = block
                    result.warnings += _block_warnings(source.label, name, block)
                if hasattr(policy, "close"):
                    policy.close()  # a vLLM engine frees its GPU memory
                del policy  # one model in memory at a time
    finally:
        torch.set_rng_state(rng_state)
    result.seconds = time.monotonic() - started
    return result


def _block_warnings(model: str, dataset: str, block: dict[str, Any]) -> list[str]:
    out = []
    if block["failed"]:
        out.append(f"{model} on {dataset}: {len(block['failed'])} question(s) could not be rendered and are not "
                   f"in the figures: {block['failure_reasons']}")
    if block["verify_failures"]:
        out.append(f"{model} on {dataset}: {block['verify_failures']} reward call(s) raised or timed out and "
                   "were scored 0 (reward.timeout_s)")
    return out


def _progress(opts: EvalOptions, settings: EvalSettings, models: list[Source],
              datasets: dict[str, list[Question]]) -> Any:
    from tqdm.auto import tqdm

    per_question = settings.samples + int(settings.greedy)
    total = per_question * len(models) * sum(len(qs) for qs in datasets.values())
    return tqdm(total=total, desc="eval", unit="seq", disable=not opts.progress)


def options_from_args(args: Any) -> EvalOptions:
    """EvalOptions from the parsed `grpo-zoo eval` flags."""
    def split(text: str | None) -> list[str]:
        return [t.strip() for t in (text or "").split(",") if t.strip()]

    try:
        ks = [int(k) for k in split(args.k)] if args.k else None
    except ValueError:
        raise ValueError(f"eval: --k takes comma-separated integers, e.g. 1,4,8; got {args.k!r}") from None
    return EvalOptions(
        samples=args.samples, ks=ks, greedy=not args.no_greedy, by=split(args.by), batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, limit=args.limit,
        seed=args.seed, backend=args.backend or "", chat_template=args.chat_template, progress=not args.no_progress,
    )


def run_cli(args: Any, default_recipe: Path) -> int:
    """`grpo-zoo eval`: evaluate, print the comparison table, write eval.json and eval.md."""
    from grpo_zoo.evaluate.report import write_report

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    try:
        result = run_eval(args.model, args.data, config=args.config, overrides=args.overrides,
                          options=options_from_args(args), default_recipe=default_recipe)
    except ValueError as exc:  # bad settings, paths, columns or model inputs: say what to change, no traceback
        print(f"grpo-zoo eval: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.output_dir or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}").expanduser()
    paths = write_report(result, out)
    print(result.summary())
    print(f"report: {paths['markdown']}, {paths['json'].name}")
    empty = [b for blocks in result.blocks.values() for b in blocks.values() if not b["figures"]["questions"]]
    return 1 if empty else 0  # a table of dashes (nothing could be rendered) must not pass as a success


__all__ = ["EvalOptions", "apply_chat_template", "load_policy", "options_from_args", "run_cli", "run_eval",
           "score_dataset"]
