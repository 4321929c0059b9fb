"""Training backends: who owns backward, clip + step, and the optimizer's saved state.

`policy_update` talks only to this interface, so it never branches on the backend's name:

    backend.zero_grad()
    for micro-batch: backend.backward(loss * share)      # share = rows / mini-batch rows
    grad_norm = backend.step(grad_clip)                   # None = non-finite, update skipped

`plain` is one process on one device with torch AdamW. `deepspeed` (backends/deepspeed_backend.py,
imported only when chosen) is ZeRO data parallel over the processes of a launcher.

Both save the optimizer in torch AdamW's own `state_dict` layout (parameters numbered in
`policy.parameters_for_training()` order, tensors at full shape), so a checkpoint written by
either backend resumes under the other, at any world size, through safetensors + JSON.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo_zoo.configuration import ConfigError


@dataclass
class DistContext:
    """This process's place in a data-parallel job (rank 0 of 1 for a plain run)."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Only the main rank writes files (metrics, config, checkpoints) and prints progress."""
        return self.rank == 0

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (a run directory, a checkpoint path); plain data only."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def setup_distributed(cfg: Any) -> DistContext:
    """Join the launcher's process group when the recipe trains with DeepSpeed; plain runs one process.

    Raises ConfigError when a launcher started several processes for the plain backend (each
    would train its own copy and write the same files).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if cfg.train.backend == "plain":
        if world > 1:
            raise ConfigError(
                f"WORLD_SIZE={world} but train.backend is 'plain', which runs one process; "
                "set train.backend=deepspeed to train data parallel, or launch a single process"
            )
        return DistContext()
    from grpo_zoo.backends.deepspeed_backend import init_distributed

    return init_distributed(cfg.train.deepspeed, cfg.model.device)


class PlainBackend:
    """torch AdamW on the policy's trainable parameters in this process (the default backend)."""

    name = "plain"

    def __init__(self, policy: Any, lr: float, weight_decay: float):
        self.policy = policy
        self.dist = DistContext()
        params = [p for p in policy.parameters_for_training() if p.requires_grad]
        # The scheduler drives this optimizer's param_groups; nothing else steps it.
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

    def wrap_policy(self, policy: Any) -> Any:
        """The policy as the training step sees it (unchanged: one process rolls out everything)."""
        return policy

    def micro_batches(self, mini_rows: torch.Tensor, micro: int) -> list[tuple[torch.Tensor, float]]:
        """Micro-batches of `micro` rows and their loss weights (share of the mini-batch, for accumulation)."""
        return [(rows, len(rows) / len(mini_rows)) for rows in mini_rows.split(micro)]

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, grad_clip: float) -> float | None:
        """Clip to `grad_clip` (0 = no clip, norm still measured) and step; None when the norm is not finite."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters_for_training(), grad_clip or float("inf"))
        if not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)  # a non-finite gradient never reaches the weights
            return None
        self.optimizer.step()
        return float(grad_norm)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a state written by either backend (JSON turned its integer keys into strings)."""
        state = dict(state)
        state["state"] = {int(k): v for k, v in state["state"].items()}
        state.pop("master_weights", None)  # fp32 copies of low-precision weights: plain trains the weights itself
        self.optimizer.load_state_dict(state)

    def reduce_metrics(self, sums: dict[str, float], count: int) -> tuple[dict[str, float], int]:
        """Sums and counts of per-micro-batch metrics over all ranks (one rank here)."""
        return sums, count

    def save_checkpoint(
        self, save: Callable[[Any, dict[str, Any]], Path], policy: Any, state_fn: Callable[[], dict[str, Any]]
    ) -> Path:
        """Write a checkpoint with `save(policy, trainer_state)` (checkpoint.save_checkpoint bound to the run)."""
        return save(policy, state_fn())


class NullLogger:
    """The metrics logger of ranks other than 0: they compute the same metrics and write nothing."""

    def log(self, step: int, metrics: dict[str, Any], histograms: dict[str, Any] | None = None) -> None:
        return None

    def close(self) -> None:
        return None


def make_train_backend(cfg: Any, policy: Any, dist: DistContext | None = None) -> Any:
    """The backend `cfg.train.backend` names, holding the optimizer for `policy`."""
    tr = cfg.train
    if tr.backend == "plain":
        return PlainBackend(policy, tr.lr, tr.weight_decay)
    from grpo_zoo.backends.deepspeed_backend import DeepSpeedBackend

    return DeepSpeedBackend(policy, cfg, dist or DistContext())


__all__ = ["DistContext", "NullLogger", "PlainBackend", "make_train_backend", "setup_distributed"]
