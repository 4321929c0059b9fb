"""`train.backend: deepspeed`: ZeRO stage 1-3 data parallel, optional CPU offload (the [deepspeed] extra).

What each rank does (world size W, launched by torchrun or the deepspeed launcher):
- the same selector with the same seed, so every rank picks the same prompts;
- rollout: rank r samples its contiguous share of the prompts (data_parallel.ShardedRolloutPolicy)
  and the shares are all-gathered, so rewards, selector updates, advantages and eval metrics are
  computed on the whole batch, identically on every rank, with no state to synchronise;
- update: each mini-batch's rows are split among ranks; a rank's loss is weighted by
  W * its rows / mini-batch rows and DeepSpeed averages gradients over ranks, so the update is
  the one-process update (exactly so for per-response aggregations; token-mean weighs tokens
  within each rank's share);
- only rank 0 writes metrics, config and checkpoints; train/* metrics are averaged over ranks.

Gradient accumulation is ours (`managed_gradient_accumulation: false`): backward only
accumulates, `engine.step()` reduces, clips (`gradient_clipping` = train.grad_clip), skips a
non-finite step and updates. On CPU the process group uses gloo (tests); on GPUs NCCL.

Checkpoints: the policy is saved by rank 0 as the plain backend saves it (a Hugging Face
directory; stage 3 gathers the full weights first). The optimizer state is gathered into
torch AdamW's own layout (full-shape `exp_avg`/`exp_avg_sq` per parameter, numbered in
`parameters_for_training()` order), plus fp32 master weights when the model trains in
bf16/fp16, and written as safetensors + JSON: no DeepSpeed checkpoint files, no unpickling,
and the checkpoint resumes under the plain backend or another world size. The cost: rank 0
holds the full optimizer state in CPU RAM while saving (12 bytes per parameter in bf16 runs).
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from grpo_zoo.backends.train_backend import DistContext


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_distributed(ds_cfg: Any, device: str = "auto") -> DistContext:
    """Join (or, for a single process without a launcher, create) the process group.

    Args:
        ds_cfg: grpo_zoo.config.DeepSpeedConfig; `dist_backend` auto = nccl with CUDA, else gloo.
        device: model.device; "cpu" forces gloo even where CUDA exists.
    Returns the rank and world size. A launcher's RANK/WORLD_SIZE/MASTER_* are kept; a bare
    process gets rank 0 of 1 on a free local port.
    """
    import deepspeed
    import torch.distributed as dist

    if "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    use_cuda = torch.cuda.is_available() and device != "cpu"
    backend = ds_cfg.dist_backend if ds_cfg.dist_backend != "auto" else ("nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # "cuda" then means this rank's GPU
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend=backend)
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size())


def deepspeed_config(cfg: Any, world_size: int) -> dict[str, Any]:
    """The DeepSpeed JSON config for a recipe (batch sizes are nominal: grpo_zoo owns accumulation)."""
    ds = cfg.train.deepspeed
    zero: dict[str, Any] = {
        "stage": ds.zero_stage,
        "reduce_bucket_size": int(ds.reduce_bucket_size),
        "overlap_comm": ds.overlap_comm,
        "contiguous_gradients": ds.contiguous_gradients,
    }
    if ds.zero_stage < 3:
        zero["allgather_bucket_size"] = int(ds.allgather_bucket_size)
    pin = torch.cuda.is_available()  # pinned host memory only helps (and only exists) with a GPU
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if ds.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    config: dict[str, Any] = {
        "train_batch_size": world_size,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,  # policy_update decides the boundary: backward*, step
        "gradient_clipping": float(cfg.train.grad_clip),
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.model.dtype == "bfloat16"},
        "fp16": {"enabled": cfg.model.dtype == "float16"},
        # torch AdamW everywhere (also offloaded): its state layout is what checkpoints store.
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,  # grpo_zoo logs its own metrics
        "wall_clock_breakdown": False,
    }
    return _merge(config, ds.extra)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


class DeepSpeedBackend:
    """A DeepSpeed engine around `policy.model` with torch AdamW as its (sharded) optimizer."""

    name = "deepspeed"

    def __init__(self, policy: Any, cfg: Any, dist: DistContext):
        import deepspeed
        from deepspeed.runtime.engine import DeepSpeedEngine

        if not hasattr(DeepSpeedEngine, "managed_gradient_accumulation"):
            raise RuntimeError(
                f"deepspeed {deepspeed.__version__} is too old for train.backend=deepspeed: grpo_zoo owns gradient "
                "accumulation (managed_gradient_accumulation: false, deepspeed >= 0.19.8); pip install -U deepspeed"
            )
        self.policy = policy
        self.dist = dist
        self.stage = cfg.train.deepspeed.zero_stage
        self.params = [p for p in policy.parameters_for_training() if p.requires_grad]  # the state's numbering
        client = torch.optim.AdamW(self.params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
        config = deepspeed_config(cfg, dist.world_size)
        self.engine, _, _, _ = deepspeed.initialize(model=policy.model, optimizer=client, config=config)
        if self.stage == 3:
            from transformers.integrations import HfDeepSpeedConfig

            # While this reference lives, transformers knows about ZeRO-3 and HF generate runs with
            # synced_gpus: a rank whose responses all ended keeps joining every layer's parameter gather.
            self._hf_zero3 = HfDeepSpeedConfig(config)
        # The torch optimizer inside ZeRO: its param_groups carry the lr the scheduler sets.
        self.optimizer = getattr(self.engine.optimizer, "optimizer", self.engine.optimizer)
        self.low_precision = cfg.model.dtype != "float32"  # then fp32 master weights differ from the model's

    # ------------------------------------------------------------------ the update

    def wrap_policy(self, policy: Any) -> Any:
        """The policy as the step sees it: rollouts sharded over ranks when there are several."""
        if self.dist.world_size == 1:
            return policy
        from grpo_zoo.backends.data_parallel import ShardedRolloutPolicy

        return ShardedRolloutPolicy(policy, self.dist)

    def micro_batches(self, mini_rows: torch.Tensor, micro: int) -> list[tuple[torch.Tensor, float]]:
        """This rank's micro-batches of a mini-batch and their loss weights.

        Rank r takes every W-th row from the r-th, so when the trainer has ordered the rows by
        length, each rank's share spans all lengths (equal work) and its micro-batches stay
        grouped by length. Every rank returns the same number of micro-batches (stage 3
        gathers parameters collectively in each forward), padding with (one row, weight 0)
        where its share ran out.
        """
        world = self.dist.world_size
        local = mini_rows[self.dist.rank :: world]
        count = math.ceil(math.ceil(len(mini_rows) / world) / micro)  # the largest share's micro-batches
        chunks = [(rows, world * len(rows) / len(mini_rows)) for rows in local.split(micro)]
        chunks += [(mini_rows[:1], 0.0)] * (count - len(chunks))
        return chunks

    def zero_grad(self) -> None:
        # engine.step() clears the accumulated gradients (also after a skipped step); nothing is left here.
        return None

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)  # the loss already carries its share of the mini-batch

    def step(self, grad_clip: float) -> float | None:
        """Reduce, clip (the config's gradient_clipping = train.grad_clip) and update; None when skipped."""
        self.engine.step()
        if not self.engine.was_step_applied():
            return None  # non-finite gradient norm (or fp16 overflow): DeepSpeed skipped and cleared it
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def reduce_metrics(self, sums: dict[str, float], count: int) -> tuple[dict[str, float], int]:
        """Sum the per-micro-batch metric sums and counts over ranks (every rank has the same keys)."""
        if self.dist.world_size == 1:
            return sums, count
        import torch.distributed as dist

        keys = sorted(sums)
        values = torch.tensor([sums[k] for k in keys] + [float(count)], dtype=torch.float64)
        values = values.to(_comm_device())
        dist.all_reduce(values)
        values = values.cpu().tolist()
        return dict(zip(keys, values[:-1])), int(values[-1])

    # ------------------------------------------------------------------ state

    def _state_keys(self) -> list[str]:
        group = self.optimizer.param_groups[0]
        return ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group.get("amsgrad") else [])

    def _flats(self) -> list[torch.Tensor]:
        """The fp32 partitions the inner AdamW steps (stage 3 lends them to param_groups only inside step)."""
        flats = getattr(self.engine.optimizer, "fp32_partitioned_groups_flat", None)
        return list(flats) if flats is not None else [p for g in self.optimizer.param_groups for p in g["params"]]

    def _materialize(self) -> None:
        """Give the inner AdamW its state before its first step (zeros, step 0: what it would create)."""
        for flat in self._flats():
            state = self.optimizer.state[flat]  # a defaultdict: {} before the first step
            state.setdefault("step", torch.tensor(0.0))
            for key in self._state_keys():
                if key not in state:
                    state[key] = torch.zeros_like(flat)
        link = getattr(self.engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
        if link is not None:  # stages 1-2: point each parameter's fragment at the state tensors
            link()

    def _step_tensor(self) -> torch.Tensor:
        for state in self.optimizer.state.values():
            if "step" in state:
                return torch.as_tensor(state["step"], dtype=torch.float32).detach().cpu().clone()
        return torch.tensor(0.0)

    def state_dict(self) -> dict[str, Any]:
        """torch AdamW's state_dict layout, full-shape tensors (collective: every rank must call it).

        Non-main ranks take part in the gathers and return an empty dict.
        """
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        self._materialize()
        main = self.dist.is_main
        step = self._step_tensor()
        state: dict[int, dict[str, torch.Tensor]] = {}
        master: dict[int, torch.Tensor] = {}
        for i, param in enumerate(self.params):
            entry = {"step": step.clone()}
            for key in self._state_keys():
                full = safe_get_full_optimizer_state(param, key)  # all-reduce / all-gather over ranks
                if main:
                    entry[key] = full.detach().float().cpu().clone()
            state[i] = entry
            if self.low_precision:
                full = safe_get_full_fp32_param(param)
                if main:
                    master[i] = full.detach().float().cpu().clone()
        if not main:
            return {}
        group = {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self.params)))
        out: dict[str, Any] = {"state": state, "param_groups": [group]}
        if master:
            out["master_weights"] = master
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a state written by either backend, at any world size (every rank loads the whole file)."""
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        saved = {int(k): v for k, v in state["state"].items()}
        groups = state["param_groups"]
        n_saved = sum(len(g["params"]) for g in groups)
        if n_saved != len(self.params):
            raise ValueError(
                f"the checkpoint's optimizer holds {n_saved} parameters but this policy trains {len(self.params)}; "
                "resume with the same model and model.lora settings"
            )
        self._materialize()
        device = self.params[0].device
        for i, param in enumerate(self.params):
            for key in self._state_keys():
                if key in saved.get(i, {}):
                    safe_set_full_optimizer_state(param, saved[i][key].to(device, torch.float32), key)
        master = {int(k): v for k, v in state.get("master_weights", {}).items()}
        for i, param in enumerate(self.params):
            if i in master:
                safe_set_full_fp32_param(param, master[i].to(device, torch.float32))
        step = next((torch.as_tensor(s["step"], dtype=torch.float32) for s in saved.values() if "step" in s), None)
        for group in self.optimizer.param_groups:
            group.update({k: v for k, v in groups[0].items() if k != "params"})
        for flat in self._flats():
            if step is not None:
                self.optimizer.state[flat]["step"] = step.clone()

    @contextlib.contextmanager
    def _full_weights(self):
        """Stage 3: every rank gathers the full parameters (read-only) for the HF save."""
        if self.stage != 3:
            yield
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.policy.model.parameters()), modifier_rank=None):
            yield

    def save_checkpoint(
        self, save: Callable[[Any, dict[str, Any]], Path], policy: Any, state_fn: Callable[[], dict[str, Any]]
    ) -> Path:
        """Gather (collective), then rank 0 writes with `save(policy, trainer_state)`; every rank gets the path."""
        state = state_fn()
        path = None
        with self._full_weights():
            if self.dist.is_main:
                path = save(policy, state)
        return self.dist.broadcast(path)


def _comm_device() -> torch.device:
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


__all__ = ["DeepSpeedBackend", "deepspeed_config", "init_distributed"]
