"""The training loop. `training_step` is ARCHITECTURE.md's numbered step, top to bottom.

Determinism: every step reseeds torch/numpy/random from (seed, step), and selectors keep
their own generators in their state, so a run resumed from a checkpoint reproduces the
uninterrupted run's metrics bit for bit on CPU.
"""

from __future__ import annotations

import json
import logging
import random
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_zoo.backends.train_backend import setup_distributed
from grpo_zoo.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint
from grpo_zoo.config import Config
from grpo_zoo.configuration import ConfigError, to_dict
from grpo_zoo.evaluation import evaluate
from grpo_zoo.metrics import group_diagnostics, group_diagnostics_by_variant, masked_mean
from grpo_zoo.rollout_ops import ScoredBatch, collect_batch
from grpo_zoo.run import Run, build_run
from grpo_zoo.slice_keys import group_slices, parse_slice_key
from grpo_zoo.types import AdvantageInputs, LossInputs, RolloutBatch

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    first_eval: dict[str, float] = field(default_factory=dict)
    last_eval: dict[str, float] = field(default_factory=dict)
    checkpoint: Path | None = None

    def summary(self) -> str:
        lines = [f"trained {self.steps} steps"]
        for key in ("eval/pass@1", "eval/greedy_accuracy"):
            if key in self.first_eval and key in self.last_eval:
                lines.append(
                    f"held-out {key[5:]}: {self.first_eval[key]:.3f} at the start -> {self.last_eval[key]:.3f}"
                )
        starts = group_slices(self.first_eval)  # eval.by slices: each value's pass@1 at the start -> end
        for column, by_name in group_slices(self.last_eval).items():
            start = starts.get(column, {}).get("pass@1", {})
            parts = [f"{v} {start[v]:.3f} -> {end:.3f}" for v, end in by_name.get("pass@1", {}).items() if v in start]
            if parts:
                lines.append(f"  pass@1 by {column}: " + " | ".join(parts))
        lines.append(f"metrics:     {self.run_dir / 'metrics.jsonl'}")
        lines.append(f"tensorboard: {self.run_dir / 'tensorboard'}")
        if self.checkpoint:
            lines.append(f"checkpoint:  {self.checkpoint}")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------
# One training step
# --------------------------------------------------------------------------------------


def training_step(run: Run, step: int) -> dict[str, float]:
    cfg = run.cfg
    seed_step(cfg.train.seed, step)
    started = time.perf_counter()

    # 1. The selector picks this step's questions and builds their prompts (variants included).
    prompts = run.selector.select(step)

    # 2-3. Roll out G responses per prompt and score them; the selector sees every scored
    #      response, and a filtering selector (DAPO dynamic sampling) may ask for more prompts.
    batch, rollout_metrics = collect_batch(run, prompts, step)
    rollout_seconds = time.perf_counter() - started
    if batch is None:  # a filtering selector kept nothing: no update this step (counted)
        run.counters["skipped_steps"] = run.counters.get("skipped_steps", 0) + 1
        log.warning(
            "step %d: the selector kept no group; no update (%d such steps so far)", step, run.counters["skipped_steps"]
        )
        with warnings.catch_warnings():  # the schedule follows training steps, updated or not
            warnings.simplefilter("ignore", UserWarning)
            run.scheduler.step()
        return {**rollout_metrics, "train/skipped_steps": run.counters["skipped_steps"], "time/step_s": rollout_seconds}

    # 4. Advantages from the estimator (one per response).
    old_logp = old_logprobs(run, batch)
    correction = rollout_correction_metrics(run, batch, old_logp)
    estimate = run.estimator.obj(advantage_inputs(run, batch, old_logp), run.cfg.algorithm.estimator.config)

    # 5. Policy update over mini-batches.
    update_metrics = policy_update(run, batch, estimate.advantages, old_logp)
    run.scheduler.step()

    # 6. Metrics.
    metrics = {
        **rollout_metrics,
        **correction,
        **group_diagnostics(batch.rewards, batch.rollout.prompt_index, batch.accuracy),
        **group_diagnostics_by_variant(
            batch.rewards, batch.rollout.prompt_index, batch.accuracy, [p.variant for p in batch.rollout.prompts]
        ),
        **{f"advantage/{k}": v for k, v in estimate.metrics.items()},
        **advantage_stats(estimate.advantages),
        **update_metrics,
        "time/rollout_s": rollout_seconds,
        "time/step_s": time.perf_counter() - started,
        "lr": run.scheduler.get_last_lr()[0],
    }
    return metrics


def seed_step(seed: int, step: int) -> None:
    step_seed = (seed * 1_000_003 + step) % (2**31)
    torch.manual_seed(step_seed)
    np.random.seed(step_seed)
    random.seed(step_seed)


def needs_old_logprobs(run: Run, batch: ScoredBatch | None = None) -> bool:
    """A separate no-grad pass is needed unless the update is a single on-policy pass.

    A rollout whose sampler reported its own log-probs (an external engine such as vLLM) also
    needs it, as in verl: rollout correction and the mismatch metric compare the trainer's
    pre-update log-probs with the sampler's. hf rollouts report none, so they keep one pass.
    """
    tr = run.cfg.train
    several_updates = tr.epochs_per_step > 1 or tr.mini_batch_size > 0
    wants_seq_logprob = "seq_logprob" in getattr(run.estimator.obj, "requires", ())
    has_sampler_logprobs = batch is not None and batch.rollout.sampler_logprobs is not None
    return several_updates or wants_seq_logprob or has_sampler_logprobs


def old_logprobs(run: Run, batch: ScoredBatch) -> torch.Tensor | None:
    if not needs_old_logprobs(run, batch):
        return None  # on-policy: the update uses the detached current log-probs
    return batched_logprobs(run.policy, batch, run.cfg.train.micro_batch_size)


def batched_logprobs(policy: Any, batch: ScoredBatch, micro: int) -> torch.Tensor:
    n = batch.rollout.num_responses
    rows = by_length(batch.rollout, torch.arange(n)) if micro and micro < n else torch.arange(n)
    with torch.no_grad():
        chunks = [policy.logprobs(batch.rollout, r)[0] for r in rows.split(micro or n)]
    ordered = torch.cat(chunks)
    logp = torch.empty_like(ordered)
    logp[rows] = ordered  # back in row order
    return logp.cpu()  # [N, T], on the CPU with the rest of the batch


def by_length(rollout: RolloutBatch, rows: torch.Tensor) -> torch.Tensor:
    """`rows` grouped by prompt, prompts by length, then responses by length (a stable sort).

    A forward pads every row to the micro-batch's longest sequence. DIVA's hinted variants have
    prompts ~1.9x as long as the originals; mixed into every micro-batch, they would set the
    length of all of them. Keeping a prompt's rows together also lets the policy run that prompt
    once per micro-batch (`Policy.prefix_sharing`). The gradient is a sum over micro-batches, so
    the order costs nothing; being stable, it keeps a run deterministic and resumable.
    """
    prompts = rollout.prompt_index[rows]
    order = torch.argsort(rollout.response_mask[rows].sum(-1), stable=True)
    order = order[torch.argsort(prompts[order], stable=True)]
    prompt_ids = rollout.extras.get("prompt_token_ids")
    if prompt_ids is not None:
        prompt_lengths = torch.tensor([len(ids) for ids in prompt_ids], dtype=torch.long)[prompts]
        order = order[torch.argsort(prompt_lengths[order], stable=True)]
    return rows[order]


def rollout_correction_metrics(run: Run, batch: ScoredBatch, old_logp: torch.Tensor | None) -> dict[str, float]:
    """Trainer-vs-sampler agreement, every step the sampler reports log-probs (ALGORITHMS.md, rollout correction).

    rollout/logprob_mismatch: mean |logp_trainer - logp_sampler| over response tokens, with the
    trainer's log-probs taken before the update; rollout/importance_weight_mean: the mean of the
    untruncated weights exp(logp_trainer - logp_sampler); with the loss's tis_cap on, also the
    truncated weights' mean and the share of tokens the cap bounds. {} without sampler log-probs.
    """
    from grpo_zoo.algorithms.loss_utils import log_ratio, sampler_mismatch
    from grpo_zoo.algorithms.loss_utils import masked_mean as token_mean

    sampler_logp = batch.rollout.sampler_logprobs
    if sampler_logp is None or old_logp is None:
        return {}
    mask = batch.rollout.response_mask.float()  # [N, T]
    valid = mask > 0
    trainer = old_logp.detach().float().cpu().masked_fill(~valid, 0.0)  # [N, T]
    sampler = sampler_logp.detach().float().cpu().masked_fill(~valid, 0.0)  # [N, T]
    raw = torch.exp(log_ratio(trainer, sampler))  # [N, T] untruncated importance weights
    metrics = {
        "rollout/logprob_mismatch": sampler_mismatch(trainer, sampler, mask),
        "rollout/importance_weight_mean": float(token_mean(raw, mask)),
    }
    cap = getattr(run.cfg.algorithm.loss.config, "tis_cap", None)
    if isinstance(cap, (int, float)):  # resolved by build_run; "auto" outside it means off
        metrics["rollout/tis_weight_mean"] = float(token_mean(raw.clamp(max=cap), mask))
        metrics["rollout/tis_capped_fraction"] = float(token_mean((raw > cap).float(), mask))
    return metrics


def advantage_inputs(run: Run, batch: ScoredBatch, old_logp: torch.Tensor | None) -> AdvantageInputs:
    rollout = batch.rollout
    prompts = rollout.prompts
    mask = rollout.response_mask
    difficulty = None
    if any(p.difficulty is not None for p in prompts):
        per_prompt = torch.tensor([5.0 if p.difficulty is None else float(p.difficulty) for p in prompts])
        difficulty = per_prompt[rollout.prompt_index]
    seq_logprob = (old_logp * mask).sum(-1) if old_logp is not None else None
    visual_entropy = None
    if "visual_entropy" in getattr(run.estimator.obj, "requires", ()):
        visual_entropy = prompt_visual_entropy(run, prompts)[rollout.prompt_index]
    return AdvantageInputs(
        rewards=batch.shaped_rewards,
        prompt_ids=rollout.prompt_index,
        question_ids=torch.tensor([p.question_id for p in prompts], dtype=torch.long)[rollout.prompt_index],
        response_mask=mask,
        difficulty=difficulty,
        seq_logprob=seq_logprob,
        visual_entropy=visual_entropy,
        extras={"reward_max": run.cfg.reward.reward_max},
    )


def prompt_visual_entropy(run: Run, prompts) -> torch.Tensor:
    """H(image) per prompt (Durian), computed once per distinct image and cached; 0 without images."""
    from grpo_zoo.algorithms.durian import spectral_entropy
    from grpo_zoo.policy import vision_patch_features

    values = []
    for prompt in prompts:
        if not prompt.images:
            values.append(0.0)
            continue
        key = _image_key(prompt.images[0])
        if key not in run.visual_entropy_cache:
            with torch.no_grad():
                features = vision_patch_features(run.policy, [prompt.images[0]])[0]
            run.visual_entropy_cache[key] = float(spectral_entropy(features.float()))
        values.append(run.visual_entropy_cache[key])
    return torch.tensor(values)


def _image_key(image) -> str:
    import hashlib

    return hashlib.sha1(image.tobytes() + str(image.size).encode()).hexdigest()


def rows_on(values: torch.Tensor | None, rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor | None:
    """These rows of a batch tensor (the batch stays on the CPU) on the device the policy computes on."""
    return None if values is None else values[rows].to(like.device)


def policy_update(run: Run, batch: ScoredBatch, advantages: torch.Tensor, old_logp: torch.Tensor | None) -> dict:
    tr = run.cfg.train
    rollout = batch.rollout
    n = rollout.num_responses
    mini = tr.mini_batch_size or n
    micro = tr.micro_batch_size or mini
    loss_cfg = run.cfg.algorithm.loss.config
    shuffle = torch.Generator().manual_seed(tr.seed * 7919 + run.step)
    ref_logp = batched_logprobs(run.ref_policy, batch, micro) if run.ref_policy is not None else None
    sums: dict[str, float] = {}
    count = 0
    skipped = 0
    grad_norms: list[float] = []
    backend = run.train_backend
    for _ in range(tr.epochs_per_step):
        order = torch.randperm(n, generator=shuffle) if mini < n else torch.arange(n)
        for mini_rows in order.split(mini):
            if micro < len(mini_rows):
                mini_rows = by_length(rollout, mini_rows)
            backend.zero_grad()
            bad_losses = bad_tokens = 0  # what made this mini-batch's update non-finite, for the warning
            # This process's micro-batches (all of them, or its rank's share) with their loss weights.
            for rows, weight in backend.micro_batches(mini_rows, micro):
                logp, entropy = run.policy.logprobs(rollout, rows, with_entropy=True)
                mask = rows_on(rollout.response_mask, rows, logp).to(logp.dtype)
                inputs = LossInputs(
                    logp=logp,
                    old_logp=rows_on(old_logp, rows, logp) if old_logp is not None else logp.detach(),
                    advantages=rows_on(advantages, rows, logp).to(logp.dtype),
                    mask=mask,
                    ref_logp=rows_on(ref_logp, rows, logp),
                    sampler_logp=rows_on(rollout.sampler_logprobs, rows, logp),
                    kl_coef=tr.kl_coef,
                    kl_estimator=tr.kl_estimator,
                    max_response_length=run.cfg.rollout.max_new_tokens,
                    seed=tr.seed * 1_000_003 + run.step,
                )
                out = run.loss.obj(inputs, loss_cfg)
                loss = out.loss
                if not torch.isfinite(loss.detach()):
                    # A non-finite loss can still have finite gradients (a NaN in a detached term):
                    # poison them, so the backend's finite check skips this update on every rank.
                    bad_losses += 1
                    bad_tokens += int((~torch.isfinite(logp.detach()) & (mask > 0)).sum())
                    loss = (logp * float("nan")).sum()
                backend.backward(loss * weight)
                if weight == 0:
                    continue  # a padding micro-batch (its rank's share ran out): no metrics
                _accumulate(
                    sums,
                    {"loss": float(out.loss.detach()), **out.metrics, "entropy": masked_mean(entropy.detach(), mask)},
                )
                count += 1
            grad_norm = backend.step(tr.grad_clip)  # clip, then update unless the norm is not finite
            if grad_norm is None:
                skipped += 1  # a non-finite loss or gradient never reaches the weights
                cause = (f"{bad_losses} micro-batch loss(es) not finite; the policy's log-probs were not finite on "
                         f"{bad_tokens} response tokens" if bad_losses else "the gradient norm was not finite")
                log.warning("step %d: update skipped: %s", run.step, cause)
                continue
            grad_norms.append(grad_norm)
    sums, count = backend.reduce_metrics(sums, count)  # averaged over ranks under data parallelism
    metrics = {f"train/{k}": v / max(count, 1) for k, v in sums.items()}
    metrics["train/grad_norm"] = float(np.mean(grad_norms)) if grad_norms else float("nan")
    metrics["train/skipped_updates"] = float(skipped)
    return metrics


def _accumulate(sums: dict[str, float], values: dict[str, float]) -> None:
    for key, value in values.items():
        sums[key] = sums.get(key, 0.0) + float(value)


def advantage_stats(advantages: torch.Tensor) -> dict[str, float]:
    return {
        "advantage/mean": float(advantages.mean()),
        "advantage/std": float(advantages.std()) if advantages.numel() > 1 else 0.0,
        "advantage/abs_mean": float(advantages.abs().mean()),
    }


# --------------------------------------------------------------------------------------
# The loop: eval, log, checkpoint, resume
# --------------------------------------------------------------------------------------


def make_run_dir(cfg: Config, recipe: str, output_dir: str | None) -> Path:
    template = output_dir or cfg.output.dir
    path = Path(template.format(recipe=recipe, time=time.strftime("%Y%m%d-%H%M%S"))).expanduser()
    if (path / "metrics.jsonl").is_file():
        raise ConfigError(f"{path} already holds a run (metrics.jsonl): continue it with --resume {path}, or pick "
                          "another --output-dir (a new run there would mix its records and checkpoints into the old)")
    path.mkdir(parents=True, exist_ok=True)
    return path


def train(cfg: Config, recipe: str = "run", resume: str | None = None, output_dir: str | None = None) -> TrainResult:
    """Run a recipe to the end (or its CPU budget); resume from a run directory's latest checkpoint."""
    # Denormals slow CPU matmuls ~1.6x on the tiny model; the warm-up flushes them too, so a
    # first run (warm-up in-process) and a cached run compute alike.
    torch.set_flush_denormal(True)
    try:
        return _train(cfg, recipe, resume, output_dir)
    finally:  # process-wide: leave callers (and later tests) their float semantics, also after a ConfigError
        torch.set_flush_denormal(False)


def _train(cfg: Config, recipe: str, resume: str | None, output_dir: str | None) -> TrainResult:
    import yaml

    dist = setup_distributed(cfg)  # rank 0 of 1 unless train.backend is deepspeed under a launcher
    if resume:
        run_dir = Path(resume).expanduser()
    else:  # rank 0 names the directory ({time} differs between processes), every rank uses it
        run_dir = dist.broadcast(make_run_dir(cfg, recipe, output_dir) if dist.is_main else None)
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if resume and checkpoint is None:
        raise ConfigError(f"--resume {resume}: no complete checkpoint under {run_dir / 'checkpoints'}")
    start_step = 0
    state: dict[str, Any] = {}
    if checkpoint is not None:
        start_step, state = load_trainer_state(checkpoint)
        cfg.model.path = str(checkpoint / "policy")
        cfg.model.lora.enabled = False
    if dist.is_main:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        print(f"grpo-zoo: run directory {run_dir}")
    else:
        cfg.output.progress = False  # one progress bar per job
    run = build_run(cfg, run_dir, resume_step=start_step if checkpoint is not None else None)
    if checkpoint is not None:
        restore(run, start_step, state)
    try:
        return loop(run, start_step)
    finally:
        run.close()


def loop(run: Run, start_step: int) -> TrainResult:
    cfg = run.cfg
    result = TrainResult(run.run_dir, start_step)
    result.first_eval = dict(run.first_eval)  # restored from the checkpoint on resume
    if start_step == 0 and cfg.eval.at_start and run.eval_pool:
        result.first_eval = evaluate(run.policy, run.eval_pool, run.rewards, run.eval_settings)
        run.logger.log(0, result.first_eval)
        print(_format_eval(0, result.first_eval))
    # CPU seconds spent in training steps only: held-out evals and checkpoints are measurement, and an
    # arm whose steps are cheaper runs more of them in a budget, so counting them would tax it.
    train_cpu = float(run.counters.get("cpu_seconds", 0.0))
    progress = _progress(cfg, start_step)
    step = start_step
    for step in range(start_step, cfg.train.steps):
        run.step = step
        if cfg.train.max_cpu_seconds and train_cpu >= cfg.train.max_cpu_seconds:
            print(f"grpo-zoo: CPU budget of {cfg.train.max_cpu_seconds:.0f} s reached after {step} steps")
            break
        step_cpu = time.process_time()
        metrics = training_step(run, step)
        done = step + 1
        train_cpu += time.process_time() - step_cpu
        metrics["time/cpu_s"] = train_cpu
        out_of_budget = bool(cfg.train.max_cpu_seconds) and train_cpu >= cfg.train.max_cpu_seconds
        is_last = done == cfg.train.steps or out_of_budget  # the last step gets its eval and checkpoint
        if run.eval_pool and ((cfg.eval.every and done % cfg.eval.every == 0) or is_last):
            eval_metrics = evaluate(run.policy, run.eval_pool, run.rewards, run.eval_settings)
            metrics.update(eval_metrics)
            result.last_eval = eval_metrics
            progress.write(_format_eval(done, eval_metrics))
            append_histograms(run.run_dir / "histograms.jsonl", done, run.selector.histograms())
        run.logger.log(done, metrics, run.selector.histograms())
        if "reward/mean" in metrics:
            progress.set_postfix(
                reward=f"{metrics['reward/mean']:.3f}", egr=f"{metrics['groups/effective_gradient_ratio']:.2f}"
            )
        progress.update(1)
        run.counters["cpu_seconds"] = metrics["time/cpu_s"]
        if (cfg.output.checkpoint_every and done % cfg.output.checkpoint_every == 0) or is_last:
            result.checkpoint = save(run, result, done)
        result.steps = done
        if out_of_budget:
            print(f"grpo-zoo: CPU budget of {cfg.train.max_cpu_seconds:.0f} s reached after {done} steps")
            break
    progress.close()
    if not result.last_eval and run.eval_pool:
        result.last_eval = evaluate(run.policy, run.eval_pool, run.rewards, run.eval_settings)
        run.logger.log(result.steps, result.last_eval)
    if result.checkpoint is None or not result.checkpoint.name.endswith(f"{result.steps:06d}"):
        result.checkpoint = save(run, result, result.steps)
    return result


def save(run: Run, result: TrainResult, step: int) -> Path:
    """A checkpoint of `step` through the training backend (under data parallelism rank 0 writes it)."""

    def write(policy: Any, state: dict[str, Any]) -> Path:
        return save_checkpoint(run.run_dir, step, policy, state, run.cfg.output.keep_checkpoints)

    return run.train_backend.save_checkpoint(write, run.policy, lambda: trainer_state(run, result))


def append_histograms(path: Path, step: int, histograms: dict[str, Any]) -> None:
    """One JSON line per eval with the selector's histograms (DIVA's D, VADE's posteriors) for `grpo-zoo bench`."""
    if histograms:
        arrays = {k: np.round(np.asarray(v, dtype=np.float64), 4).tolist() for k, v in histograms.items()}
        with path.open("a") as f:
            f.write(json.dumps({"step": step, **arrays}) + "\n")


def trainer_state(run: Run, result: TrainResult) -> dict[str, Any]:
    return {
        "optimizer": run.train_backend.state_dict(),  # torch AdamW layout for every backend (collective)
        "scheduler": run.scheduler.state_dict(),
        "selector": run.selector.state_dict(),
        "counters": dict(run.counters),
        "first_eval": result.first_eval,
    }


def restore(run: Run, step: int, state: dict[str, Any]) -> None:
    try:
        run.train_backend.load_state_dict(state["optimizer"])
    except ValueError as exc:  # torch: "loaded state dict contains a parameter group that doesn't match ..."
        raise ConfigError(
            f"--resume: the checkpoint's optimizer state does not fit the parameters this recipe trains ({exc}); "
            "resume with the run's own config.yaml (model.freeze_vision_tower and model.lora must not change)"
        ) from None
    run.scheduler.load_state_dict(state["scheduler"])
    run.selector.load_state_dict(state["selector"])
    run.counters.update(state.get("counters", {}))
    run.first_eval = state.get("first_eval", {})
    run.step = step


def _progress(cfg: Config, start: int):
    from tqdm.auto import tqdm

    return tqdm(total=cfg.train.steps, initial=start, disable=not cfg.output.progress, desc="train", unit="step")


def _format_eval(step: int, metrics: dict[str, float]) -> str:
    """One line of the eval's figures, then one line per eval.by column: its values' pass@1 (else greedy)."""
    parts = [f"{k[5:]}={v:.3f}" for k, v in metrics.items() if k.startswith("eval/") and not parse_slice_key(k)]
    lines = [f"[eval @ step {step}] " + " ".join(parts)]
    for column, by_name in group_slices(metrics).items():
        name = "pass@1" if "pass@1" in by_name else next(iter(by_name))
        lines.append(f"    {name} by {column}: " + " | ".join(f"{v} {x:.3f}" for v, x in by_name[name].items()))
    return "\n".join(lines)
