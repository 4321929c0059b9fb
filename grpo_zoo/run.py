"""Everything a training run holds, and how it is built from a Config.

`build_run` checks the config against the data and model before any training starts, so a
user error surfaces as a ConfigError that says what to change.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from grpo_zoo.config import Config
from grpo_zoo.configuration import ConfigError
from grpo_zoo.data import LoadReport, load_questions
from grpo_zoo.evaluation import EvalSettings
from grpo_zoo.metrics import MetricsLogger
from grpo_zoo.registry import ESTIMATORS, LOSSES, SELECTORS, Entry
from grpo_zoo.types import Question

log = logging.getLogger(__name__)


@dataclass
class Run:
    """The live objects of one training run."""

    cfg: Config
    run_dir: Path
    policy: Any
    ref_policy: Any | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    selector: Any
    estimator: Entry
    loss: Entry
    rewards: Any  # RewardRunner
    train_pool: list[Question]
    eval_pool: list[Question]
    eval_settings: EvalSettings
    logger: MetricsLogger
    model_path: str
    step: int = 0
    counters: dict[str, float] = field(default_factory=dict)  # cumulative, saved in checkpoints
    first_eval: dict[str, float] = field(default_factory=dict)  # the eval at step 0, kept across resumes
    visual_entropy_cache: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    def close(self) -> None:
        self.logger.close()
        self.rewards.close()


def check_config(cfg: Config) -> None:
    """Cross-field checks that need no model: caught before anything heavy loads."""
    tr = cfg.train
    needs_groups = getattr(ESTIMATORS.get(cfg.algorithm.estimator.name).obj, "min_group_size", 2)
    if cfg.rollout.group_size < needs_groups:
        raise ConfigError(
            f"rollout.group_size = {cfg.rollout.group_size}, but estimator '{cfg.algorithm.estimator.name}' compares "
            f"responses within a group and needs at least {needs_groups}; set rollout.group_size >= {needs_groups}"
        )
    if tr.mini_batch_size and tr.micro_batch_size and tr.mini_batch_size % tr.micro_batch_size:
        raise ConfigError(
            f"train.mini_batch_size = {tr.mini_batch_size} is not divisible by train.micro_batch_size = "
            f"{tr.micro_batch_size}; choose a micro batch that divides the mini batch"
        )
    if cfg.rollout.backend != "hf":
        raise ConfigError(f"rollout.backend '{cfg.rollout.backend}' is not available in this build; use 'hf'")
    if cfg.eval.samples < 0 or cfg.eval.num_questions < 0:
        raise ConfigError("eval.samples and eval.num_questions must be >= 0")


def resolve_model_path(cfg: Config) -> str:
    if cfg.model.path == "testbed":
        from grpo_zoo.testbed.warmup import ensure_testbed_model

        return str(ensure_testbed_model(cfg.testbed, log=print))
    path = Path(cfg.model.path).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model.path '{cfg.model.path}' is not a local Hugging Face model directory (no config.json there); "
            "give a directory written by save_pretrained, or 'testbed'"
        )
    return str(path)


def pick_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def build_run(cfg: Config, run_dir: Path, resume_step: int | None = None) -> Run:
    from grpo_zoo.policy import Policy
    from grpo_zoo.reward_runner import RewardRunner

    check_config(cfg)
    train_pool, report = load_questions(cfg.data.train, cfg.data, cfg.testbed, "train")
    _report_load(report)
    eval_pool, report = load_questions(cfg.data.eval, cfg.data, cfg.testbed, "eval")
    _report_load(report)
    eval_pool = eval_pool[: cfg.eval.num_questions]

    model_path = resolve_model_path(cfg)
    device = pick_device(cfg.model.device)
    torch.manual_seed(cfg.train.seed)
    policy = Policy.from_pretrained(model_path, device=device, dtype=cfg.model.dtype, lora=cfg.model.lora)
    ref_policy = None
    if cfg.train.kl_coef > 0:
        ref_policy = Policy.from_pretrained(model_path, device=device, dtype=cfg.model.dtype)

    params = [p for p in policy.parameters_for_training() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lr_schedule(cfg))

    selector_spec = cfg.algorithm.selector
    selector = SELECTORS.get(selector_spec.name).obj(
        train_pool, selector_spec.config, batch_size=cfg.train.questions_per_step, seed=cfg.train.seed
    )
    rewards = RewardRunner(
        [(f.name, f.weight) for f in cfg.reward.functions],
        accuracy_function=cfg.reward.accuracy_function,
        reward_max=cfg.reward.reward_max,
        timeout_s=cfg.reward.timeout_s,
        num_workers=cfg.reward.num_workers,
    )
    eval_settings = EvalSettings(
        samples=cfg.eval.samples,
        greedy=cfg.eval.greedy,
        batch_size=cfg.eval.batch_size,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        max_new_tokens=cfg.rollout.max_new_tokens,
        template=cfg.data.prompt_template,
        system_prompt=cfg.data.system_prompt,
    )
    logger = MetricsLogger(run_dir, tensorboard=cfg.output.tensorboard, resume_step=resume_step)
    return Run(
        cfg=cfg,
        run_dir=run_dir,
        policy=policy,
        ref_policy=ref_policy,
        optimizer=optimizer,
        scheduler=scheduler,
        selector=selector,
        estimator=ESTIMATORS.get(cfg.algorithm.estimator.name),
        loss=LOSSES.get(cfg.algorithm.loss.name),
        rewards=rewards,
        train_pool=train_pool,
        eval_pool=eval_pool,
        eval_settings=eval_settings,
        logger=logger,
        model_path=model_path,
    )


def lr_schedule(cfg: Config):
    """Multiplier on the base lr per training step: linear warm-up, then constant/cosine/linear decay."""
    tr = cfg.train

    def factor(step: int) -> float:
        if tr.lr_warmup_steps and step < tr.lr_warmup_steps:
            return (step + 1) / tr.lr_warmup_steps
        progress = min(1.0, (step - tr.lr_warmup_steps) / max(1, tr.steps - tr.lr_warmup_steps))
        if tr.lr_schedule == "cosine":
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
        if tr.lr_schedule == "linear":
            return 1.0 - 0.9 * progress
        return 1.0

    return factor


def _report_load(report: LoadReport) -> None:
    if report.skipped:
        log.warning(
            "dataset '%s': skipped %d of %d rows (%s)", report.source, report.skipped, report.rows, report.reasons
        )
