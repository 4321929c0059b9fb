"""`grpo-zoo audit`: does a model on a dataset meet the premises of the methods a recipe would train?

GRPO-family methods assume things about the base model that a head-to-head silently depends
on (ARCHITECTURE.md, "Conditions the testbed must meet"): mixed groups to learn from, all-wrong
groups that only a hint can rescue (DIVA-GRPO, arXiv 2603.01106), variants that move accuracy
the way their labels say, difficulty signals that track accuracy (Durian, arXiv 2602.21743),
and questions revisited often enough for per-question state (DIVA's D, VADE's posteriors).
The audit measures each on a fixed, seeded subset of the training pool, with the recipe's own
prompt template, sampling settings and reward:
  1. originals: G sampled responses + 1 greedy per question -> all-wrong / mixed / all-right
     shares, the 0..G success histogram, greedy and sampled pass@1, pass@k;
  2. every variant kind the `diva` selector can build from the data (each hint depth, the
     paraphrase, each image perturbation alone, only-vision), built by the selector's own code,
     on the first `variant_questions` of the subset that have the material; a paired bootstrap
     verdict per kind (rule in grpo_zoo.audit_report);
  3. Durian's visual entropy and confidence against accuracy, computed as the trainer does;
  4. revisits of the training pool over the recipe's run.
Randomness: the subset from `seed`; each kind's sampling from its own seed derived from
(seed, kind name), so restricting --kinds never changes another kind's numbers; the caller's
torch RNG is restored afterwards.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_zoo.audit_report import INTENDED, AuditResult, compare_kind, durian_signals, findings_for, group_stats
from grpo_zoo.audit_report import revisits as revisit_stats
from grpo_zoo.config import Config
from grpo_zoo.data import load_questions
from grpo_zoo.evaluation import as_prompts
from grpo_zoo.rewards import last_boxed
from grpo_zoo.samplers import _diva_plan as diva_plan
from grpo_zoo.samplers._common import keyed_rng
from grpo_zoo.samplers.diva import DivaSelector, DivaSelectorConfig
from grpo_zoo.types import Prompt, Question
from grpo_zoo.variants import TRANSFORMS

AUDIT_STEP = 0xA0D17  # the "step" in each variant's RNG key: never a real training step's variant
HINT_DEPTHS = (1, 2, 3)  # plan_for_shift(-k) reveals k steps for k <= 3; "hint_all" (s <= -4) all of them
KIND_NAMES = (*(f"hint_{k}" for k in HINT_DEPTHS), "hint_all", "paraphrase", *(f"perturb_{t}" for t in TRANSFORMS),
              "only_vision")
"""Every kind the audit knows, in report order (easiest first)."""


@dataclass
class AuditSettings:
    """Sizes and statistics of an audit (the CLI flags of `grpo-zoo audit`)."""

    questions: int = 512  # originals audited: a seeded subset of the training pool (>= 500 keeps CIs ~ +-0.03)
    variant_questions: int = 128  # questions per variant kind; the cost of an audit is ~ (1 + kinds * this / questions)
    group_size: int = 0  # G responses per question; 0 = the recipe's rollout.group_size
    seed: int = 0  # picks the subset and seeds every kind's sampling
    batch_size: int = 0  # sequences per generate call; 0 = the recipe's eval.batch_size
    kinds: list[str] | None = None  # audit only these kinds or families (hint, perturb, ...); None = all buildable
    perturb_strength: float = 0.45  # strength of each single-transform perturbation (the paper's 0.30 / 0.45)
    max_new_tokens: int = 0  # 0 = the recipe's rollout.max_new_tokens
    greedy: bool = True  # also one greedy response per question (greedy pass@1)
    resamples: int = 2000  # bootstrap resamples for every CI
    level: float = 0.95  # confidence level of every CI
    durian: bool = True  # visual entropy + confidence (one extra forward over the originals' responses)
    progress: bool = True  # a tqdm bar over the sequences to sample
    skip_variants_if_unparsed: bool = True  # nothing parses: the variant figures would all be 0, so skip them

    def check(self) -> None:
        bad = {name: getattr(self, name) for name in ("questions", "resamples") if getattr(self, name) < 1}
        bad.update({n: getattr(self, n) for n in ("variant_questions", "group_size", "batch_size", "max_new_tokens")
                    if getattr(self, n) < 0})
        if bad:
            name, value = next(iter(bad.items()))
            raise ValueError(f"audit: {name} = {value} is out of range; questions and resamples must be >= 1, "
                             "the other sizes >= 0 (0 = the recipe's value)")
        if not 0.0 < self.perturb_strength <= 1.0:
            raise ValueError(f"audit: perturb_strength must be in (0, 1], got {self.perturb_strength}")
        if not 0.0 < self.level < 1.0:
            raise ValueError(f"audit: level must be in (0, 1), e.g. 0.95, got {self.level}")
        unknown = [k for k in self.kinds or [] if k not in KIND_NAMES and k not in INTENDED]
        if unknown:
            raise ValueError(f"audit: unknown kind(s) {unknown}; choose from {list(KIND_NAMES)} or the families "
                             f"{list(INTENDED)}")


@dataclass(frozen=True)
class VariantKind:
    """One kind the audit builds: a DIVA plan (and, for a perturbation, the one transform)."""

    name: str
    family: str  # hint | paraphrase | perturb | only_vision (the selector's kind)
    plan: diva_plan.VariantPlan
    transform: str | None = None


def family_of(name: str) -> str:
    return next(f for f in INTENDED if name == f or name.startswith(f + "_"))


def _selected(name: str, selection: list[str] | None) -> bool:
    """Whether kind `name` (or a whole family, for a family-wide reason) was asked for."""
    if selection is None:
        return True
    if name in INTENDED:  # a family: asked for by name or through any of its kinds
        return any(family_of(s) == name for s in selection)
    return name in selection or family_of(name) in selection


def diva_config(cfg: Config) -> DivaSelectorConfig:
    """The recipe's diva selector options (kinds, transforms, canvas), or the defaults."""
    found = cfg.algorithm.selector.config
    nested = [v for v in vars(found).values() if hasattr(v, "config")] if dataclasses.is_dataclass(found) else []
    for candidate in [found, *[v.config for v in nested]]:  # e.g. dapo_filter wrapping diva
        if isinstance(candidate, DivaSelectorConfig):
            return candidate
    return DivaSelectorConfig()


def _family_reasons(questions: list[Question], diva: DivaSelectorConfig, is_vlm: bool, cfg: Config) -> dict[str, str]:
    """Family -> why the selector cannot build it from these questions (families it can are left out)."""
    d = cfg.data
    material = {
        "hint": any(q.hint_steps for q in questions) or f"no question has hint steps (column '{d.hint_key}', "
        "data.hint_key)",
        "paraphrase": any(q.paraphrases for q in questions) or f"no question has paraphrases (column "
        f"'{d.paraphrase_key}', data.paraphrase_key)",
        "perturb": any(q.images for q in questions) or f"no question has an image (column '{d.image_key}', "
        "data.image_key)",
        "only_vision": True,  # renders the text even without an image
    }
    reasons = {}
    for family, ok in material.items():
        if family not in diva.kinds:
            reasons[family] = "switched off in algorithm.selector.kinds"
        elif family in ("perturb", "only_vision") and not is_vlm:
            reasons[family] = "the model is text-only (no image processor)"
        elif ok is not True:
            reasons[family] = str(ok)
    return reasons


def plan_kinds(questions: list[Question], diva: DivaSelectorConfig, *, is_vlm: bool, strength: float,
               cfg: Config) -> tuple[list[VariantKind], dict[str, str]]:
    """The kinds the selector can build from these questions, and why each other kind cannot be built.

    Hint depths follow the selector's plans (shift -k reveals k steps, k <= 3; below, all); a
    depth beyond every question's step count would repeat a shallower one, so it is left out.
    Each image transform is audited alone at `strength`, so a transform that hides nothing shows.
    """
    missing = _family_reasons(questions, diva, is_vlm, cfg)
    kinds: list[VariantKind] = []
    if "hint" not in missing:
        max_steps = max(len(q.hint_steps) for q in questions)
        depths = [k for k in HINT_DEPTHS if k <= max_steps]
        kinds += [VariantKind(f"hint_{k}", "hint", diva_plan.plan_for_shift(-k)) for k in depths]
        missing.update({f"hint_{k}": f"questions have at most {max_steps} hint step(s): same as hint_{max_steps}"
                        for k in HINT_DEPTHS if k > max_steps})
        if max_steps > HINT_DEPTHS[-1]:
            kinds.append(VariantKind("hint_all", "hint", diva_plan.plan_for_shift(-HINT_DEPTHS[-1] - 1)))
    if "paraphrase" not in missing:
        kinds.append(VariantKind("paraphrase", "paraphrase", diva_plan.plan_for_shift(0)))
    if "perturb" not in missing:
        shift = next((s for s, (n, st) in diva_plan.PERTURB_LEVELS.items() if n == 1 and st == strength), 1)
        single = diva_plan.VariantPlan("perturb", shift, num_transforms=1, strength=strength)
        kinds += [VariantKind(f"perturb_{t}", "perturb", single, t) for t in TRANSFORMS if t in diva.transforms]
        missing.update({f"perturb_{t}": "not in algorithm.selector.transforms" for t in TRANSFORMS
                        if t not in diva.transforms})
    if "only_vision" not in missing:
        kinds.append(VariantKind("only_vision", "only_vision", diva_plan.plan_for_shift(diva_plan.ONLY_VISION_SHIFT)))
    return kinds, missing


class VariantBuilder:
    """Builds each kind with the diva selector's own material code, keyed like a training variant."""

    def __init__(self, pool: list[Question], diva: DivaSelectorConfig, seed: int):
        self.pool, self.diva, self.seed = pool, diva, seed
        self._selectors: dict[str | None, DivaSelector] = {}

    def selector(self, kind: VariantKind) -> DivaSelector:
        if kind.transform not in self._selectors:
            cfg = dataclasses.replace(self.diva, transforms=[kind.transform]) if kind.transform else self.diva
            self._selectors[kind.transform] = DivaSelector(self.pool, cfg, batch_size=1, seed=self.seed)
        return self._selectors[kind.transform]

    def questions_for(self, kind: VariantKind, questions: list[Question], limit: int) -> list[Question]:
        """The first `limit` questions that have this kind's material (as the selector judges it)."""
        sel = self.selector(kind)
        return [q for q in questions if sel.available(q, kind.family)][:limit]

    def build(self, kind: VariantKind, q: Question) -> Prompt:
        key = (self.seed, AUDIT_STEP, int(q.question_id), KIND_NAMES.index(kind.name))
        # _material is the selector's private builder: used so the audit tests exactly what training shows.
        problem, images, details = self.selector(kind)._material(q, kind.plan, keyed_rng(*key), key)
        return Prompt(question_id=int(q.question_id), problem=problem, answer=q.answer, images=images,
                      variant=kind.family, extras={"audit_kind": kind.name, **details})


@dataclass
class Sampled:
    """Outcome of sampling a list of prompts."""

    successes: np.ndarray  # [B] int, correct responses per prompt (accuracy >= 0.5)
    parsed: int  # responses with a \\boxed{} answer
    responses: int
    confidence: np.ndarray | None  # [B] mean over the G responses of the summed token log-prob (Durian's c_p)
    example: str  # the first response, for messages


class Sampler:
    """Batched generate + score with the recipe's template, sampling settings and reward."""

    def __init__(self, policy: Any, rewards: Any, cfg: Config, settings: AuditSettings, bar: Any):
        self.policy, self.rewards, self.cfg, self.settings, self.bar = policy, rewards, cfg, settings, bar

    @torch.no_grad()
    def run(self, prompts: list[Prompt], *, greedy: bool, confidence: bool = False) -> Sampled:
        g = 1 if greedy else self.settings.group_size
        per_call = max(1, self.settings.batch_size // g)
        successes, conf, parsed, example = [], [], 0, ""
        for start in range(0, len(prompts), per_call):
            chunk = prompts[start : start + per_call]
            encoded = self.policy.encode(chunk, template=self.cfg.data.prompt_template,
                                         system_prompt=self.cfg.data.system_prompt)
            rollout = self.policy.generate(encoded, group_size=g, temperature=self.cfg.rollout.temperature,
                                           top_p=self.cfg.rollout.top_p, greedy=greedy,
                                           max_new_tokens=self.settings.max_new_tokens)
            texts = rollout.response_texts
            result = self.rewards.score(texts, [chunk[i].answer for i in rollout.prompt_index.tolist()])
            successes.append((result.accuracy >= 0.5).view(len(chunk), g).sum(1))  # [b]
            parsed += sum(last_boxed(t) is not None for t in texts)
            example = example or texts[0]
            if confidence:
                conf.append(self._seq_logprob(rollout).view(len(chunk), g).mean(1))  # [b]
            self.bar.update(len(texts))
        return Sampled(torch.cat(successes).numpy().astype(np.int64), parsed, len(prompts) * g,
                       torch.cat(conf).double().numpy() if confidence else None, example)


    def _seq_logprob(self, rollout: Any) -> torch.Tensor:
        """[N] summed token log-prob per response, as the trainer's seq_logprob, in micro-batches (the
        full-vocabulary log-softmax of a real model is ~0.6 GB per 1k-token row)."""
        micro = self.cfg.train.micro_batch_size or 8
        parts = []
        for rows in torch.arange(rollout.response_mask.shape[0]).split(micro):
            logp, _ = self.policy.logprobs(rollout, rows)  # [n, T]
            parts.append((logp * rollout.response_mask[rows].to(logp.device)).sum(-1).cpu())
        return torch.cat(parts)


def resolve_model(cfg: Config, model: str | None) -> str:
    """A model directory: an HF dir, a grpo_zoo checkpoint (step-N or its policy/) or run dir, or `testbed`."""
    from grpo_zoo.checkpoint import latest_checkpoint
    from grpo_zoo.run import resolve_model_path

    name = model or cfg.model.path
    path = Path(name).expanduser()
    candidates = [path, path / "policy"]
    checkpoint = latest_checkpoint(path) if name != "testbed" and path.is_dir() else None
    if checkpoint is not None:
        candidates.append(checkpoint / "policy")
    found = next((c for c in candidates if (c / "config.json").is_file()), None) if name != "testbed" else None
    cfg = copy.deepcopy(cfg)
    cfg.model.path = str(found) if found is not None else name
    return resolve_model_path(cfg)  # builds the testbed model, or says what is wrong with the path


def _load_policy(cfg: Config, model: str | None) -> tuple[str, Any]:
    """(name for the report, Policy) on the recipe's device and dtype; LoRA checkpoints are saved merged."""
    from grpo_zoo.policy import Policy
    from grpo_zoo.run import pick_device

    path = resolve_model(cfg, model)
    policy = Policy.from_pretrained(path, device=pick_device(cfg.model.device), dtype=cfg.model.dtype)
    return ("testbed" if (model or cfg.model.path) == "testbed" else path), policy


def _kind_seed(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**31)


def _unparsed_message(cfg: Config, policy: Any, prompt: Prompt, sampled: Sampled) -> str:
    rendered = policy.encode([prompt], template=cfg.data.prompt_template, system_prompt=cfg.data.system_prompt).texts[0]
    return (f"none of the {sampled.responses} sampled responses has a final answer the reward can read "
            f"(a \\boxed{{...}}), so every accuracy here is 0. The prompt template is data.prompt_template = "
            f"{cfg.data.prompt_template!r} (system prompt {cfg.data.system_prompt!r}): make it ask for the final "
            "answer in \\boxed{}, e.g. '{problem} Put the final answer in \\boxed{}.', or check that --model is "
            f"a trained checkpoint. Rendered prompt: {rendered[-200:]!r}; a response: {sampled.example[:120]!r}")


def _visual_entropy(policy: Any, prompts: list[Prompt]) -> tuple[np.ndarray | None, str]:
    """H(first image) per prompt exactly as the trainer computes it for Durian (0 without an image)."""
    from types import SimpleNamespace

    from grpo_zoo.trainer import prompt_visual_entropy

    if not policy.is_vlm:
        return None, "the model is text-only"
    if not any(p.images for p in prompts):
        return None, "no audited question has an image"
    run = SimpleNamespace(policy=policy, visual_entropy_cache={})
    return prompt_visual_entropy(run, prompts).double().numpy(), ""


def _resolve_settings(cfg: Config, settings: AuditSettings) -> AuditSettings:
    settings.check()
    return dataclasses.replace(
        settings,
        group_size=settings.group_size or cfg.rollout.group_size,
        batch_size=settings.batch_size or cfg.eval.batch_size,
        max_new_tokens=settings.max_new_tokens or cfg.rollout.max_new_tokens,
    )


def audit(cfg: Config, settings: AuditSettings | None = None, *, model: str | None = None,
          data: str | None = None, policy: Any | None = None) -> AuditResult:
    """Audit `model` (default cfg.model.path) on `data` (default cfg.data.train) under recipe `cfg`.

    `policy`: an already loaded grpo_zoo Policy (e.g. mid-training) to audit instead of loading
    `model`, which is then only its name in the report.
    Returns an AuditResult: `originals` (GroupStats: share_all_wrong / _all_right / _mixed at
    G, histogram, pass@k), `kinds` (per variant kind: GroupStats, paired difference with CI,
    verdict), `not_built` (kind -> reason), `durian`, `revisits`, `findings`, `warnings`;
    `accuracy_by_kind()` and `verdicts()` summarise them.
    Raises ConfigError/ValueError for a bad model path, dataset or setting.
    """
    from grpo_zoo.reward_runner import RewardRunner

    started = time.monotonic()
    cfg = copy.deepcopy(cfg)
    cfg.data.train = data or cfg.data.train
    settings = _resolve_settings(cfg, settings or AuditSettings())
    pool, _ = load_questions(cfg.data.train, cfg.data, cfg.testbed, "train")
    order = keyed_rng(settings.seed, AUDIT_STEP).permutation(len(pool))[: settings.questions]
    subset = [pool[int(i)] for i in order]
    name = model or cfg.model.path
    if policy is None:
        name, policy = _load_policy(cfg, model)
    diva = diva_config(cfg)
    kinds, not_built = plan_kinds(subset, diva, is_vlm=policy.is_vlm, strength=settings.perturb_strength, cfg=cfg)
    kinds = [k for k in kinds if _selected(k.name, settings.kinds)]
    not_built = {k: why for k, why in not_built.items() if _selected(k, settings.kinds)}
    builder = VariantBuilder(pool, diva, settings.seed)
    per_kind = {k.name: builder.questions_for(k, subset, settings.variant_questions) for k in kinds}
    rng_state = torch.get_rng_state()
    try:
        with RewardRunner.from_config(cfg.reward) as rewards, _progress(settings, subset, per_kind) as bar:
            sampler = Sampler(policy, rewards, cfg, settings, bar)
            result = _run(cfg, settings, sampler, builder, subset, kinds, per_kind, not_built)
    finally:
        torch.set_rng_state(rng_state)
    result.model = name
    result.data, result.pool_size = cfg.data.train, len(pool)
    result.revisits = revisit_stats(len(pool), cfg.train.steps, cfg.train.questions_per_step)
    result.findings = findings_for(result)
    result.seconds = time.monotonic() - started
    return result


def _progress(settings: AuditSettings, subset: list[Question], per_kind: dict[str, list[Question]]) -> Any:
    from tqdm.auto import tqdm

    per_question = settings.group_size + int(settings.greedy)
    total = per_question * (len(subset) + sum(len(qs) for qs in per_kind.values()))
    return tqdm(total=total, desc="audit", unit="seq", disable=not settings.progress)


def _run(cfg: Config, settings: AuditSettings, sampler: Sampler, builder: VariantBuilder, subset: list[Question],
         kinds: list[VariantKind], per_kind: dict[str, list[Question]], not_built: dict[str, str]) -> AuditResult:
    stat_args = {"resamples": settings.resamples, "level": settings.level, "seed": settings.seed}
    prompts = as_prompts(subset)
    torch.manual_seed(_kind_seed(settings.seed, "original"))
    sampled = sampler.run(prompts, greedy=False, confidence=settings.durian)
    greedy = sampler.run(prompts, greedy=True).successes if settings.greedy else None
    parse_rate = sampled.parsed / sampled.responses
    warnings = []
    unparsed = sampled.parsed == 0 and not sampled.successes.any()  # a reward reading no box may still score some
    if unparsed:
        warnings.append(_unparsed_message(cfg, sampler.policy, prompts[0], sampled))
    elif parse_rate < 0.5:
        warnings.append(f"only {parse_rate:.0%} of the responses have a \\boxed{{}} answer: the format, not the "
                        f"task, dominates accuracy (data.prompt_template = {cfg.data.prompt_template!r})")
    originals = group_stats(sampled.successes, settings.group_size, greedy=greedy, parse_rate=parse_rate, **stat_args)
    index = {int(q.question_id): i for i, q in enumerate(subset)}
    results = {}
    if unparsed and settings.skip_variants_if_unparsed and kinds:
        not_built["variants"] = "skipped: no original response could be parsed (see the warning)"
        kinds = []
    for kind in kinds:
        questions = per_kind[kind.name]
        if not questions:
            not_built[kind.name] = "no audited question has the material for it"
            continue
        sampler.bar.set_postfix_str(kind.name)
        variant_prompts = [builder.build(kind, q) for q in questions]
        torch.manual_seed(_kind_seed(settings.seed, kind.name))
        got = sampler.run(variant_prompts, greedy=False)
        kind_greedy = sampler.run(variant_prompts, greedy=True).successes if settings.greedy else None
        original = sampled.successes[[index[int(q.question_id)] for q in questions]]
        results[kind.name] = compare_kind(kind.name, kind.family, got.successes, original, settings.group_size,
                                          question_ids=[int(q.question_id) for q in questions], greedy=kind_greedy,
                                          parse_rate=got.parsed / got.responses, **stat_args)
    durian = _durian(cfg, settings, sampler.policy, prompts, sampled)
    return AuditResult(
        model="", data="", prompt_template=cfg.data.prompt_template, system_prompt=cfg.data.system_prompt,
        settings=dataclasses.asdict(settings), pool_size=0, originals=originals,
        question_ids=[int(q.question_id) for q in subset], successes=sampled.successes.tolist(), kinds=results,
        not_built=not_built, durian=durian, revisits={}, warnings=warnings,
    )


def _durian(cfg: Config, settings: AuditSettings, policy: Any, prompts: list[Prompt], sampled: Sampled) -> dict:
    if not settings.durian:
        return durian_signals(sampled.successes / settings.group_size, None, None, missing="switched off")
    from grpo_zoo.algorithms.durian import DurianConfig

    estimator = cfg.algorithm.estimator
    bins = estimator.config.bins if isinstance(estimator.config, DurianConfig) else DurianConfig().bins
    entropy, why = _visual_entropy(policy, prompts)
    return durian_signals(sampled.successes / settings.group_size, entropy, sampled.confidence, bins, missing=why)


def run_cli(args: Any, default_recipe: Path) -> int:
    """`grpo-zoo audit`: build the settings from the flags, audit, write the report, print the summary."""
    from grpo_zoo.audit_report import write_report
    from grpo_zoo.config import load_config

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    path = Path(args.config) if args.config else default_recipe
    cfg = load_config(path, args.overrides)
    settings = AuditSettings(
        questions=args.questions, variant_questions=args.variant_questions, group_size=args.group_size,
        seed=args.seed, batch_size=args.batch_size, perturb_strength=args.perturb_strength,
        kinds=[k.strip() for k in args.kinds.split(",") if k.strip()] if args.kinds else None,
        greedy=not args.no_greedy, durian=not args.no_durian, progress=not args.no_progress,
    )
    try:
        result = audit(cfg, settings, model=args.model, data=args.data)
    except ValueError as exc:  # bad settings, dataset rows or model inputs: say what to change, no traceback
        print(f"grpo-zoo audit: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or f"runs/audit-{time.strftime('%Y%m%d-%H%M%S')}").expanduser()
    paths = write_report(result, out)
    print(result.summary())
    print(f"report: {paths['markdown']}, {paths['json'].name}, {paths['plot'].name}")
    return 1 if result.nothing_parses else 0  # a report of zeros must not pass as a success in scripts


__all__ = ["KIND_NAMES", "AuditSettings", "VariantKind", "audit", "plan_kinds", "resolve_model", "run_cli"]
