"""Rollout and reward workers as Ray actors (`rollout.backend: ray`, `distributed.ray`).

Rollout: each worker actor holds a copy of the policy. A rollout's prompts are split into the
seeded blocks of `grpo_zoo.backends.rollout` and the blocks are dealt round-robin to the workers,
so the result equals the in-process `hf` rollout with the same `rollout.sampling_shards`.
Weights: after each update the trainer's trainable parameters are put once into the object
store; a worker loads them before its next block (it compares versions), so nothing moves while
the version is unchanged (e.g. the refill rounds of dynamic sampling).

Rewards: `RayRewardScorer` has RewardRunner.score's interface; responses are split into
contiguous chunks scored by reward actors (each with its own RewardRunner, so the per-call time
limit still holds) and merged in order, metrics recomputed over the whole batch.

Fault tolerance: actors are restarted by Ray (max_restarts). A call whose actor died is sent
again with the same inputs and the same seed, up to max_call_retries times; results are
gathered per block and merged only when every block has one, so a crash neither loses nor
duplicates a sample. A restarted rollout worker has no weights version, so it loads the current
weights before sampling. Ray is imported only here, so installs without it never need it.

On a multi-node cluster, every node must see model.path at the same path (a shared filesystem):
a worker loads the architecture (and frozen weights) from there, then the trainer's trainable
weights from the object store. Held-out evaluation still samples in the trainer's process.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from grpo_zoo.backends.rollout import (
    Sampling,
    concat_rollouts,
    draw_shard_seeds,
    seeded_generate,
    select_encoded,
    shard_bounds,
)
from grpo_zoo.types import RolloutBatch

if TYPE_CHECKING:
    from grpo_zoo.config import Config, RayConfig, RewardConfig, WorkerResources
    from grpo_zoo.policy import EncodedPrompts, Policy
    from grpo_zoo.reward_runner import RewardResult

log = logging.getLogger(__name__)

# Fault injection for tests: when this directory holds a file `kill-<kind>` (kind = rollout or
# reward), the first worker of that kind to claim it SIGKILLs itself inside its next call.
FAULT_DIR_ENV = "GRPO_ZOO_FAULT_DIR"

_RAY_STATE = {"started": False, "users": 0}


def acquire_ray(rc: RayConfig) -> None:
    """Connect to Ray (rc.address) or start a private local cluster; counted, see release_ray."""
    import ray

    if not ray.is_initialized():
        if rc.address:
            ray.init(address=rc.address, include_dashboard=False, log_to_driver=True)
        else:
            ray.init(
                num_cpus=rc.num_cpus or None,
                object_store_memory=rc.object_store_mb * 2**20 if rc.object_store_mb else None,
                include_dashboard=False,
            )
        _RAY_STATE["started"] = True
    if _RAY_STATE["started"]:
        _RAY_STATE["users"] += 1


def release_ray() -> None:
    """Shut Ray down when the last user of a cluster this module started lets go of it."""
    if not _RAY_STATE["started"]:
        return  # Ray was started by someone else (a test, a script): theirs to stop
    _RAY_STATE["users"] -= 1
    if _RAY_STATE["users"] <= 0:
        import ray

        ray.shutdown()
        _RAY_STATE.update(started=False, users=0)


def _actor_options(res: WorkerResources, rc: RayConfig) -> dict[str, Any]:
    return {
        "num_cpus": res.num_cpus,
        "num_gpus": res.num_gpus,
        "resources": dict(res.resources) or None,
        "max_restarts": rc.max_restarts,
        "max_task_retries": 0,  # retried by call_with_retries, which knows the call's inputs and seed
    }


def _maybe_fault(kind: str) -> None:
    """Test hook (FAULT_DIR_ENV): die by SIGKILL mid-call, as an OOM kill or a lost node would."""
    directory = os.environ.get(FAULT_DIR_ENV)
    if not directory:
        return
    try:  # rename is atomic: exactly one worker claims the fault
        os.rename(os.path.join(directory, f"kill-{kind}"), os.path.join(directory, f"killed-{kind}-{os.getpid()}"))
    except OSError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def call_with_retries(submit: Callable[[int], Any], count: int, max_retries: int, what: str,
                      worker_of: Callable[[int], Any], restart_timeout_s: float = 300.0) -> tuple[list, int]:
    """Run calls 0..count-1 (submit(i) -> ObjectRef) and return their results in order and the retries.

    A call whose actor died (RayActorError) waits until Ray has restarted that actor
    (worker_of(i), answering `pid`) and is submitted again, same i and so the same inputs and
    seed, up to max_retries times each. Any other error (a bug in the call) is raised as it is.
    """
    import ray
    from ray.exceptions import RayActorError

    pending = {submit(i): i for i in range(count)}
    results: dict[int, Any] = {}
    attempts = [0] * count
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        i = pending.pop(done[0])
        try:
            results[i] = ray.get(done[0])
        except RayActorError as exc:
            attempts[i] += 1
            if attempts[i] > max_retries:
                raise RuntimeError(
                    f"{what} {i}: its worker died {attempts[i]} times; raise distributed.ray.max_call_retries or "
                    f"find why workers die (memory? see the Ray logs): {exc}"
                ) from exc
            log.warning("%s %d: its worker died (%s); waiting for the restart to send it again (attempt %d)",
                        what, i, type(exc).__name__, attempts[i] + 1)
            wait_until_alive(worker_of(i), restart_timeout_s, what)
            pending[submit(i)] = i
    return [results[i] for i in range(count)], sum(attempts)


def wait_until_alive(worker: Any, timeout_s: float, what: str) -> None:
    """Block until a restarting actor answers; RuntimeError if it is dead for good or too slow."""
    import ray
    from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.get(worker.pid.remote(), timeout=max(1.0, min(10.0, deadline - time.monotonic())))
            return
        except ActorDiedError as exc:
            raise RuntimeError(
                f"a {what} worker died and will not restart (distributed.ray.max_restarts used up): {exc}"
            ) from exc
        except (ActorUnavailableError, GetTimeoutError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"a {what} worker did not come back within {timeout_s:g} s of dying") from None
            time.sleep(0.2)


# --------------------------------------------------------------------------------------
# Rollout workers
# --------------------------------------------------------------------------------------


def trainable_state(policy: Policy) -> dict[str, torch.Tensor]:
    """The parameters training changes (all, or the LoRA adapters), detached on CPU."""
    return {name: p.detach().cpu() for name, p in policy.model.named_parameters() if p.requires_grad}


class RolloutWorker:
    """A Ray actor with a policy copy; samples seeded blocks with the weights of a given version."""

    def __init__(self, model_path: str, device: str, dtype: str, lora: Any, num_threads: int):
        from grpo_zoo.policy import Policy

        torch.set_num_threads(num_threads)
        torch.set_flush_denormal(True)  # as the trainer does: sampling must compute exactly alike
        self.policy = Policy.from_pretrained(model_path, device=device, dtype=dtype, lora=lora)
        self.version: int | None = None  # None after a (re)start: the next call loads weights

    def pid(self) -> int:
        return os.getpid()

    def generate(self, encoded: EncodedPrompts, sampling: Sampling, seed: int, version: int,
                 weights: list) -> RolloutBatch:
        """One block; `weights` is [ObjectRef] (nested, so Ray fetches it only when needed)."""
        import ray

        _maybe_fault("rollout")
        if version != self.version:
            state = ray.get(weights[0])
            result = self.policy.model.load_state_dict(state, strict=False)
            if result.unexpected_keys:
                raise ValueError(f"rollout worker: weights for unknown parameters {result.unexpected_keys[:3]}")
            self.version = version
        batch = seeded_generate(self.policy, encoded, sampling, seed)
        # The driver has the prompts and their tensors; sending them back would only cost transfer.
        batch.prompts = []
        batch.extras = {k: v for k, v in batch.extras.items() if not k.startswith("prompt_")}
        return batch


class RayRollout:
    """`rollout.backend: ray`: seeded blocks sampled by `num_rollout_workers` policy copies."""

    def __init__(self, cfg: Config, policy: Policy, model_path: str):
        import ray

        rc = cfg.distributed.ray
        acquire_ray(rc)
        self.policy = policy
        self.shards = cfg.rollout.sampling_shards or rc.num_rollout_workers
        self.max_call_retries = rc.max_call_retries
        self.retries = 0  # calls re-sent after a worker died, over the run
        self.version: int | None = None
        self._weights: Any = None  # ObjectRef of the current trainable_state
        res = rc.rollout
        device = "cuda" if res.num_gpus > 0 else "cpu"
        actor_cls = ray.remote(RolloutWorker).options(**_actor_options(res, rc))
        self.workers = [
            actor_cls.remote(model_path, device, cfg.model.dtype, cfg.model.lora, max(1, int(res.num_cpus)))
            for _ in range(rc.num_rollout_workers)
        ]

    def sync_weights(self, version: int) -> None:
        """Put the trainer's weights into the object store once per version (workers pull them)."""
        import ray

        if version != self.version:
            self._weights = ray.put(trainable_state(self.policy))
            self.version = version

    def generate(self, encoded: EncodedPrompts, sampling: Sampling, *, version: int) -> RolloutBatch:
        self.sync_weights(version)
        bounds = shard_bounds(len(encoded), self.shards)
        seeds = draw_shard_seeds(len(bounds))
        blocks = [select_encoded(encoded, a, b) for a, b in bounds]
        for block in blocks:  # the prompts stay here (images); the worker needs only their tensors
            block.prompts = [None] * len(block.prompts)  # type: ignore[list-item]

        def submit(k: int) -> Any:
            worker = self.workers[k % len(self.workers)]
            return worker.generate.remote(blocks[k], sampling, seeds[k], version, [self._weights])

        parts, retries = call_with_retries(submit, len(blocks), self.max_call_retries, "rollout block",
                                           lambda k: self.workers[k % len(self.workers)])
        self.retries += retries
        for part, (a, b) in zip(parts, bounds):
            part.prompts = list(encoded.prompts[a:b])
            part.extras["prompt_token_ids"] = list(encoded.token_ids[a:b])
            part.extras["prompt_model_inputs"] = list(encoded.model_inputs[a:b])
        batch = concat_rollouts(parts, self.policy.pad_token_id)
        batch.policy_version = version
        return batch

    def close(self) -> None:
        import ray

        if self.workers and ray.is_initialized():
            for worker in self.workers:
                ray.kill(worker)
        if self.workers:
            self.workers = []
            self._weights = None
            release_ray()


# --------------------------------------------------------------------------------------
# Reward workers
# --------------------------------------------------------------------------------------


class RewardWorker:
    """A Ray actor with a RewardRunner (its own processes and time limits)."""

    def __init__(self, reward_cfg: RewardConfig):
        from grpo_zoo.reward_runner import RewardRunner

        self.runner = RewardRunner.from_config(reward_cfg)

    def pid(self) -> int:
        return os.getpid()

    def score(self, responses: list[str], answers: list[str], contexts: list[dict] | None) -> RewardResult:
        _maybe_fault("reward")
        return self.runner.score(responses, answers, contexts)

    def close(self) -> None:
        self.runner.close()


class RayRewardScorer:
    """RewardRunner.score across `num_reward_workers` Ray actors; same result, same metrics keys."""

    def __init__(self, reward_cfg: RewardConfig, rc: RayConfig):
        import ray

        from grpo_zoo.reward_runner import RewardRunner

        RewardRunner.from_config(reward_cfg).close()  # config errors surface here, in the driver
        acquire_ray(rc)
        self.max_call_retries = rc.max_call_retries
        self.retries = 0
        actor_cls = ray.remote(RewardWorker).options(**_actor_options(rc.reward, rc))
        self.workers = [actor_cls.remote(reward_cfg) for _ in range(rc.num_reward_workers)]

    def score(self, responses: Sequence[str], answers: Sequence[str],
              contexts: Sequence[dict[str, Any]] | None = None) -> RewardResult:
        """Score N responses in contiguous chunks, one per worker, merged in order."""
        n = len(responses)
        if len(answers) != n or (contexts is not None and len(contexts) != n):
            raise ValueError(f"RayRewardScorer.score needs one answer (and context) per response; got {n} responses, "
                             f"{len(answers)} answers")
        started = time.monotonic()
        bounds = shard_bounds(n, len(self.workers)) or [(0, 0)]

        def submit(k: int) -> Any:
            a, b = bounds[k]
            ctx = list(contexts[a:b]) if contexts is not None else None
            return self.workers[k % len(self.workers)].score.remote(list(responses[a:b]), list(answers[a:b]), ctx)

        parts, retries = call_with_retries(submit, len(bounds), self.max_call_retries, "reward chunk",
                                           lambda k: self.workers[k % len(self.workers)])
        self.retries += retries
        return merge_reward_results(parts, time.monotonic() - started)

    def close(self) -> None:
        import ray

        if self.workers and ray.is_initialized():
            try:  # stop the reward processes cleanly; a killed actor's children exit when their pipe closes
                ray.get([w.close.remote() for w in self.workers], timeout=10)
            except Exception as exc:  # a dead or hung worker: killing it below is all that is left
                log.debug("reward worker close: %s", exc)
            for worker in self.workers:
                ray.kill(worker)
        if self.workers:
            self.workers = []
            release_ray()


def merge_reward_results(parts: list[RewardResult], seconds: float) -> RewardResult:
    """Chunks' RewardResults as one: tensors concatenated, counts summed, statistics recomputed.

    The means and the (population) std are computed over the concatenated tensors, so they are
    the values one RewardRunner scoring the whole batch reports. An unknown "*_mean" key falls
    back to the chunk-size-weighted mean.
    """
    from grpo_zoo.reward_runner import RewardResult

    if len(parts) == 1:
        parts[0].metrics["reward_seconds"] = seconds
        return parts[0]
    overall = torch.cat([p.overall for p in parts])  # [N]
    per_function = {name: torch.cat([p.per_function[name] for p in parts]) for name in parts[0].per_function}
    accuracy = torch.cat([p.accuracy for p in parts])  # [N]
    n = int(overall.numel())
    by_key = {"reward_mean": overall, "accuracy_mean": accuracy}
    by_key.update({f"reward_{name}_mean": values for name, values in per_function.items()})
    metrics: dict[str, float] = {}
    for key in parts[0].metrics:
        if key == "reward_seconds":
            metrics[key] = seconds
        elif key == "reward_std":
            metrics[key] = float(overall.std(unbiased=False)) if n else 0.0
        elif key in by_key:
            metrics[key] = float(by_key[key].mean()) if n else 0.0
        elif key.endswith(("_timeouts", "_errors")):
            metrics[key] = float(sum(p.metrics[key] for p in parts))
        else:
            sizes = [int(p.overall.numel()) for p in parts]
            metrics[key] = sum(p.metrics[key] * s for p, s in zip(parts, sizes)) / max(sum(sizes), 1)
    return RewardResult(overall, per_function, accuracy, metrics,
                        sum(p.timeouts for p in parts), sum(p.errors for p in parts))


__all__ = [
    "FAULT_DIR_ENV",
    "RayRewardScorer",
    "RayRollout",
    "RewardWorker",
    "RolloutWorker",
    "acquire_ray",
    "call_with_retries",
    "merge_reward_results",
    "release_ray",
    "trainable_state",
]
