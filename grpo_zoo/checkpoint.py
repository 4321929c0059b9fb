"""Atomic checkpoints: policy in plain Hugging Face format, the rest as safetensors + JSON.

A checkpoint is written into `step-NNNNNN.tmp` and renamed only when complete, so a kill
at any moment leaves the previous checkpoint loadable. Nothing here unpickles.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from grpo_zoo.state_io import fsync_dir, load_state, save_state

PREFIX = "step-"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"{PREFIX}{step:06d}"


def save_checkpoint(run_dir: Path, step: int, policy: Any, trainer_state: dict[str, Any], keep: int = 2) -> Path:
    """Write the policy and `trainer_state` (optimizer, scheduler, selector, counters) atomically."""
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    policy.save(tmp / "policy")
    save_state(trainer_state, tmp, "trainer_state")
    (tmp / "meta.json").write_text(json.dumps({"step": step, "format": 1}))
    fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    _prune(final.parent, keep)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run (half-written `.tmp` ones are ignored)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir() if p.name.startswith(PREFIX) and not p.name.endswith(".tmp"))
    return done[-1] if done else None


def load_trainer_state(checkpoint: Path) -> tuple[int, dict[str, Any]]:
    meta = json.loads((checkpoint / "meta.json").read_text())
    return int(meta["step"]), load_state(checkpoint, "trainer_state")


def _prune(root: Path, keep: int) -> None:
    done = sorted(p for p in root.iterdir() if p.name.startswith(PREFIX) and not p.name.endswith(".tmp"))
    for old in done[: max(0, len(done) - max(keep, 1))]:
        shutil.rmtree(old, ignore_errors=True)
