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
from grpo_zoo.data import LoadReport, fit_to_policy, load_questions
from grpo_zoo.evaluation import EvalSettings, settings_from_config
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
    rewards: Any  # RewardRunner, or RayRewardScorer (same score interface) with distributed.ray reward workers
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
    train_backend: Any = None  # backends.train_backend: owns backward, clip + step and the optimizer's state
    rollout_backend: Any = None  # backends.rollout.RolloutBackend; None = hf sampling with `policy`

    def close(self) -> None:
        self.logger.close()
        self.rewards.close()
        if self.rollout_backend is not None:
            self.rollout_backend.close()


def check_config(cfg: Config, environment: bool = True) -> None:
    """Every user error that needs no model, caught before anything heavy loads.

    Each ConfigError names the field and what to change. environment=False skips what depends
    on this machine (model and dataset paths, installed backends, a GPU), for `grpo-zoo
    validate` of a recipe meant for another machine.
    """
    for bad, message in _field_checks(cfg):
        if bad:
            raise ConfigError(message)
    _check_batches(cfg)
    _check_rewards(cfg)
    tr = cfg.train
    needs_groups = getattr(ESTIMATORS.get(cfg.algorithm.estimator.name).obj, "min_group_size", 2)
    if cfg.rollout.group_size < needs_groups:
        raise ConfigError(
            f"rollout.group_size = {cfg.rollout.group_size}, but estimator '{cfg.algorithm.estimator.name}' compares "
            f"responses within a group and needs at least {needs_groups}; set rollout.group_size >= {needs_groups}"
        )
    if tr.mini_batch_size and 0 < tr.micro_batch_size < tr.mini_batch_size and tr.mini_batch_size % tr.micro_batch_size:
        raise ConfigError(
            f"train.mini_batch_size = {tr.mini_batch_size} is not divisible by train.micro_batch_size = "
            f"{tr.micro_batch_size}; choose a micro batch that divides the mini batch"
        )
    if environment:
        check_backends(cfg)
    if cfg.eval.samples < 0 or cfg.eval.num_questions < 0:
        raise ConfigError("eval.samples and eval.num_questions must be >= 0")
    if environment:
        check_model_path(cfg.model.path)
        for key in ("train", "eval"):
            source = getattr(cfg.data, key)
            if source != "testbed" and not Path(source).expanduser().exists():
                raise ConfigError(
                    f"data.{key} '{source}' does not exist: give a local parquet/jsonl/arrow file or directory, "
                    "or 'testbed'"
                )


def _field_checks(cfg: Config) -> list[tuple[bool, str]]:
    """(is wrong, message) for every single-field range the dataclasses do not check themselves."""
    tr, ro, data, out = cfg.train, cfg.rollout, cfg.data, cfg.output
    return [
        (not (math.isfinite(tr.lr) and tr.lr > 0), f"train.lr must be a positive number, got {tr.lr}"),
        (tr.epochs_per_step < 1, f"train.epochs_per_step must be >= 1, got {tr.epochs_per_step}"),
        (tr.mini_batch_size < 0 or tr.micro_batch_size < 0,
         "train.mini_batch_size and train.micro_batch_size must be >= 0 (0 = the whole batch)"),
        (not tr.grad_clip >= 0, f"train.grad_clip must be >= 0 (0 = no clipping), got {tr.grad_clip}"),
        (not tr.kl_coef >= 0, f"train.kl_coef must be >= 0, got {tr.kl_coef}"),
        (not tr.weight_decay >= 0, f"train.weight_decay must be >= 0, got {tr.weight_decay}"),
        (tr.lr_warmup_steps < 0, f"train.lr_warmup_steps must be >= 0, got {tr.lr_warmup_steps}"),
        (ro.max_new_tokens < 1, f"rollout.max_new_tokens must be >= 1, got {ro.max_new_tokens}"),
        (not ro.temperature > 0, f"rollout.temperature must be > 0, got {ro.temperature}"),
        (not 0 < ro.top_p <= 1, f"rollout.top_p must be in (0, 1], got {ro.top_p}"),
        (data.max_prompt_length < 1, f"data.max_prompt_length must be >= 1 token, got {data.max_prompt_length}"),
        (not 0 <= data.max_bad_row_share <= 1,
         f"data.max_bad_row_share must be a share in [0, 1], got {data.max_bad_row_share}"),
        ("{problem}" not in data.prompt_template,
         f"data.prompt_template must contain '{{problem}}' (where the question goes), got {data.prompt_template!r}"),
        (data.min_pixels > data.max_pixels,
         f"data.min_pixels ({data.min_pixels}) must be <= data.max_pixels ({data.max_pixels})"),
        (out.checkpoint_every < 0, f"output.checkpoint_every must be >= 0 (0 = only at the end), got "
                                   f"{out.checkpoint_every}"),
        (out.keep_checkpoints < 1, f"output.keep_checkpoints must be >= 1, got {out.keep_checkpoints}"),
    ]


def responses_per_step(cfg: Config) -> int:
    """N of a step as configured: questions x (1 + variants of every nested selector) x G."""
    prompts = cfg.train.questions_per_step
    spec = cfg.algorithm.selector
    while spec is not None:
        options = getattr(spec, "config", None)
        prompts *= 1 + int(getattr(options, "num_variants", 0) or 0)
        spec = getattr(options, "inner", None)
    return prompts * cfg.rollout.group_size


def _check_batches(cfg: Config) -> None:
    """Mini-batches must split a step's N responses evenly, so every optimizer step weighs alike."""
    tr = cfg.train
    n = responses_per_step(cfg)
    parts = f"{cfg.train.questions_per_step} train.questions_per_step x {cfg.rollout.group_size} rollout.group_size"
    if n != cfg.train.questions_per_step * cfg.rollout.group_size:
        parts += " x (1 + the selector's num_variants)"
    if tr.mini_batch_size > 0 and n % tr.mini_batch_size:
        divisors = [d for d in range(1, n + 1) if n % d == 0 and d <= tr.mini_batch_size]
        raise ConfigError(
            f"a step's batch of {n} responses ({parts}) is not divisible by train.mini_batch_size = "
            f"{tr.mini_batch_size}; set train.mini_batch_size to a divisor of {n} (e.g. {divisors[-1]}) or 0 "
            "(the whole batch), or change the batch"
        )
    # A micro batch at least as large as the batch is the whole batch (a recipe's default of 32 stays
    # valid when a smaller batch is asked for on the command line).
    if 0 < tr.micro_batch_size < n and not tr.mini_batch_size and n % tr.micro_batch_size:
        raise ConfigError(
            f"a step's batch of {n} responses ({parts}) is not divisible by train.micro_batch_size = "
            f"{tr.micro_batch_size}; set train.micro_batch_size to a divisor of {n}"
        )


def _check_rewards(cfg: Config) -> None:
    """The reward runner's own checks (weights, R_max, time limit, importable functions) as ConfigErrors."""
    from grpo_zoo.reward_runner import check_reward_settings

    try:
        check_reward_settings(
            [(f.name, f.weight) for f in cfg.reward.functions],
            cfg.reward.accuracy_function,
            cfg.reward.reward_max,
            cfg.reward.timeout_s,
            cfg.reward.num_workers,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_model_path(path_text: str) -> None:
    """model.path must be `testbed` or a local directory with a config.json (nothing is downloaded)."""
    if path_text == "testbed":
        return
    path = Path(path_text).expanduser()
    if not (path / "config.json").is_file():
        hint = "no such directory" if not path.exists() else "it has no config.json"
        raise ConfigError(
            f"model.path '{path_text}' is not a local Hugging Face model directory ({hint}); give a directory "
            "with the config.json and weights of save_pretrained (download the model first: grpo_zoo never "
            "downloads), or 'testbed'"
        )


def check_backends(cfg: Config) -> None:
    """The rollout backend and Ray workers can run here (their optional packages are installed)."""
    import importlib.util

    if cfg.rollout.sampling_shards < 0:
        raise ConfigError(f"rollout.sampling_shards = {cfg.rollout.sampling_shards}; use 0 (automatic) or more")
    wants_ray = cfg.rollout.backend == "ray" or cfg.distributed.ray.num_reward_workers > 0
    if wants_ray and importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "rollout.backend 'ray' and distributed.ray.num_reward_workers > 0 need Ray: pip install 'grpo_zoo[ray]' "
            "(or 'ray[default]'), or use rollout.backend=hf and distributed.ray.num_reward_workers=0"
        )
    if cfg.rollout.backend == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("rollout.backend 'vllm' needs vLLM: pip install 'grpo_zoo[vllm]' (GPU only), or use 'hf'")
        if not torch.cuda.is_available() or pick_device(cfg.model.device) == "cpu":
            raise ConfigError("rollout.backend 'vllm' runs on a GPU, colocated with training; use 'hf' on CPU")


def resolve_model_path(cfg: Config) -> str:
    """The local directory of model.path, warming up (once, cached) the testbed model for `testbed`."""
    if cfg.model.path == "testbed":
        from grpo_zoo.testbed.warmup import ensure_testbed_model

        return str(ensure_testbed_model(cfg.testbed, log=print))
    check_model_path(cfg.model.path)
    return str(Path(cfg.model.path).expanduser())


def check_pool(cfg: Config, train_pool: list[Question]) -> None:
    """The training pool must hold at least one step's questions."""
    if len(train_pool) < cfg.train.questions_per_step:
        raise ConfigError(
            f"train.questions_per_step = {cfg.train.questions_per_step} but data.train '{cfg.data.train}' has only "
            f"{len(train_pool)} usable questions; lower train.questions_per_step or use a larger dataset"
        )


MAX_EVAL_SLICES = 64  # values per eval.by column: each logs its own metrics at every eval


def check_eval_columns(cfg: Config, eval_pool: list[Question]) -> None:
    """Every eval.by column is a question column of the held-out set, with few enough values to log."""
    for column in cfg.eval.by:
        values = {str(q.extras[column]) for q in eval_pool if column in q.extras}
        if not values and eval_pool:
            known = sorted({k for q in eval_pool for k in q.extras})
            raise ConfigError(f"eval.by: no held-out question of data.eval '{cfg.data.eval}' has the column "
                              f"{column!r}; its columns are {known}")
        if len(values) > MAX_EVAL_SLICES:
            raise ConfigError(f"eval.by: column {column!r} has {len(values)} distinct values (at most "
                              f"{MAX_EVAL_SLICES}); break the eval down by a coarser column")


def pick_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def build_run(cfg: Config, run_dir: Path, resume_step: int | None = None) -> Run:
    from grpo_zoo.backends.rollout import make_rollout_backend
    from grpo_zoo.backends.train_backend import NullLogger, make_train_backend, setup_distributed
    from grpo_zoo.policy import Policy
    from grpo_zoo.reward_runner import RewardRunner

    check_config(cfg)
    train_pool, train_report = load_questions(cfg.data.train, cfg.data, cfg.testbed, "train")
    eval_pool, eval_report = load_questions(cfg.data.eval, cfg.data, cfg.testbed, "eval")
    check_eval_columns(cfg, eval_pool[: cfg.eval.num_questions])

    model_path = resolve_model_path(cfg)
    device = pick_device(cfg.model.device)
    torch.manual_seed(cfg.train.seed)
    policy = Policy.from_pretrained(
        model_path, device=device, dtype=cfg.model.dtype, lora=cfg.model.lora,
        gradient_checkpointing=cfg.model.gradient_checkpointing, freeze_vision_tower=cfg.model.freeze_vision_tower,
        prefix_sharing=cfg.model.prefix_sharing,
    )
    ref_policy = None
    if cfg.train.kl_coef > 0:
        ref_policy = Policy.from_pretrained(model_path, device=device, dtype=cfg.model.dtype,
                                            prefix_sharing=cfg.model.prefix_sharing)
    # Rows whose prompt exceeds data.max_prompt_length are skipped like unreadable ones.
    train_pool, train_report = fit_to_policy(train_pool, train_report, policy, cfg.data)
    eval_pool, eval_report = fit_to_policy(eval_pool, eval_report, policy, cfg.data)
    _report_load(train_report)
    _report_load(eval_report)
    check_pool(cfg, train_pool)
    eval_pool = eval_pool[: cfg.eval.num_questions]

    dist = setup_distributed(cfg)  # rank 0 of 1 for the plain backend; joins the launcher's group otherwise
    train_backend = make_train_backend(cfg, policy, dist)
    optimizer = train_backend.optimizer  # the torch optimizer whose param_groups the scheduler drives
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lr_schedule(cfg))
    policy = train_backend.wrap_policy(policy)

    selector_spec = cfg.algorithm.selector
    selector = SELECTORS.get(selector_spec.name).obj(
        train_pool, selector_spec.config, batch_size=cfg.train.questions_per_step, seed=cfg.train.seed
    )
    if cfg.distributed.ray.num_reward_workers > 0:
        from grpo_zoo.backends.ray_workers import RayRewardScorer

        rewards = RayRewardScorer(cfg.reward, cfg.distributed.ray)
    else:
        rewards = RewardRunner(
            [(f.name, f.weight) for f in cfg.reward.functions],
            accuracy_function=cfg.reward.accuracy_function,
            reward_max=cfg.reward.reward_max,
            timeout_s=cfg.reward.timeout_s,
            num_workers=cfg.reward.num_workers,
        )
    rollout_backend = make_rollout_backend(cfg, policy, model_path)
    apply_rollout_correction(cfg, rollout_backend)
    eval_settings = settings_from_config(cfg)
    logger = (
        MetricsLogger(run_dir, tensorboard=cfg.output.tensorboard, resume_step=resume_step)
        if dist.is_main
        else NullLogger()  # only rank 0 writes metrics
    )
    if resume_step is None and (train_report.skipped or eval_report.skipped):
        # The skipped-row counts, once per run (a resumed run keeps its first record); absent = none skipped.
        logger.log(0, {**train_report.metrics("train"), **eval_report.metrics("eval")})
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
        train_backend=train_backend,
        rollout_backend=rollout_backend,
    )


def apply_rollout_correction(cfg: Config, rollout_backend: Any) -> None:
    """Resolve the loss config's `tis_cap: auto` by the rollout backend (ALGORITHMS.md, rollout correction).

    An external sampler (backend attribute `external_sampler`, e.g. vLLM) gets truncated importance
    sampling with the default cap C; a backend running the trainer's own model (hf, ray) gets none,
    as its weights would all be 1. A cap the recipe sets (a number, or null for off) is kept. A loss
    config without a `tis_cap` field is left alone.
    """
    from grpo_zoo.algorithms.loss_utils import TIS_AUTO, resolve_tis_cap

    loss_cfg = cfg.algorithm.loss.config
    if not hasattr(loss_cfg, "tis_cap"):
        return
    external = bool(getattr(rollout_backend, "external_sampler", False))
    requested = loss_cfg.tis_cap
    loss_cfg.tis_cap = resolve_tis_cap(requested, external)
    if requested == TIS_AUTO and loss_cfg.tis_cap is not None:
        log.warning(
            "rollout.backend '%s' samples with an external engine: rollout correction (truncated importance "
            "sampling) on with algorithm.loss.tis_cap = %s; set it to null to turn it off",
            cfg.rollout.backend, loss_cfg.tis_cap,
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
