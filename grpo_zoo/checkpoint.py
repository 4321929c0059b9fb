"""Atomic checkpoints: policy in plain Hugging Face format, the rest as safetensors + JSON.

A checkpoint is written into `step-NNNNNN.tmp`, flushed to disk, and renamed to
`step-NNNNNN` only when complete (meta.json is its last file), so a kill at any moment
leaves the previous checkpoint loadable: readers only ever see complete directories.
Nothing here unpickles, and a policy with a non-finite weight is never written.

Test hook (documented, off unless set): GRPO_ZOO_CHECKPOINT_PAUSE="STEP:SECONDS" makes
save_checkpoint sleep SECONDS after the checkpoint of STEP is complete in its .tmp directory
and before the rename, so a test can kill the process exactly mid-checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from grpo_zoo.configuration import ConfigError
from grpo_zoo.state_io import fsync_dir, fsync_tree, load_state, save_state

PREFIX = "step-"
FORMAT = 1
PAUSE_ENV = "GRPO_ZOO_CHECKPOINT_PAUSE"
_COMPLETE = re.compile(r"step-(\d+)")  # step-NNNNNN; not .tmp (being written), .old (being replaced), .del


class NonFiniteWeights(RuntimeError):
    """The policy holds NaN/inf weights: writing them would overwrite good checkpoints with garbage."""


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{PREFIX}{step:06d}"


def save_checkpoint(run_dir: Path, step: int, policy: Any, trainer_state: dict[str, Any], keep: int = 2) -> Path:
    """Write the policy and `trainer_state` (optimizer, scheduler, selector, counters) atomically.

    Keeps the newest `keep` checkpoints (at least 1). Raises NonFiniteWeights, writing
    nothing, when a policy weight is NaN or inf.
    """
    _check_finite(policy, step)
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    old = final.with_name(final.name + ".old")
    if tmp.exists():
        shutil.rmtree(tmp)  # a half-written leftover of a killed run
    tmp.mkdir(parents=True)
    policy.save(tmp / "policy")
    save_state(trainer_state, tmp, "trainer_state")
    (tmp / "meta.json").write_text(json.dumps({"step": step, "format": FORMAT}))  # last: marks it complete
    fsync_tree(tmp)
    _test_pause(step)
    if final.exists():  # the same step saved again: swap, so some complete copy exists at every instant
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)
    _prune(final.parent, keep)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run (half-written `.tmp` ones are ignored)."""
    done = _complete(Path(run_dir) / "checkpoints")
    return done[-1] if done else None


def load_trainer_state(checkpoint: Path) -> tuple[int, dict[str, Any]]:
    """(step, trainer state) of a checkpoint directory; safetensors + JSON only, never unpickled."""
    checkpoint = Path(checkpoint)
    meta_path = checkpoint / "meta.json"
    if not meta_path.is_file():
        raise ConfigError(f"'{checkpoint}' is not a complete grpo_zoo checkpoint (no meta.json)")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT:
        raise ConfigError(f"checkpoint '{checkpoint}' has format {meta.get('format')}; this grpo_zoo reads {FORMAT}")
    return int(meta["step"]), load_state(checkpoint, "trainer_state")


def _complete(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first: every `step-N` (only renames publish one), and a
    finished `.old` copy whose swap was cut short before its replacement appeared."""
    if not root.is_dir():
        return []
    found: dict[int, Path] = {}
    for path in sorted(root.iterdir(), key=lambda p: p.name.endswith(".old")):  # step-N before step-N.old
        name = path.name.removesuffix(".old")
        match = _COMPLETE.fullmatch(name)
        if not match or not path.is_dir() or int(match[1]) in found:
            continue
        if path.name == name or (path / "meta.json").is_file():
            found[int(match[1])] = path
    return [found[step] for step in sorted(found)]


def _prune(root: Path, keep: int) -> None:
    done = _complete(root)
    for stale in done[: max(0, len(done) - max(keep, 1))]:
        doomed = stale.with_name(stale.name.removesuffix(".old") + ".del")
        os.replace(stale, doomed)  # a deletion cut short leaves a .del, never a half-empty step-N
        shutil.rmtree(doomed, ignore_errors=True)
    for leftover in root.iterdir():  # .tmp / .old / .del of runs killed mid-checkpoint (one writer: none is live)
        if leftover.name.startswith(PREFIX) and leftover.suffix in (".tmp", ".old", ".del") and leftover not in done:
            shutil.rmtree(leftover, ignore_errors=True)


def _check_finite(policy: Any, step: int) -> None:
    model = getattr(policy, "model", None)
    if model is None or not hasattr(model, "named_parameters"):
        return
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.is_floating_point() and not bool(torch.isfinite(param).all()):
                raise NonFiniteWeights(
                    f"step {step}: policy weight '{name}' is NaN or inf; no checkpoint written, the previous "
                    "ones are intact (lower train.lr or check the loss)"
                )


def _test_pause(step: int) -> None:
    spec = os.environ.get(PAUSE_ENV, "")
    if spec:
        pause_step, _, seconds = spec.partition(":")
        if int(pause_step) == step:
            time.sleep(float(seconds or 60))
