"""kill -9 in the middle of a checkpoint, then --resume (issue #7).

A `grpo-zoo train` subprocess is paused (GRPO_ZOO_CHECKPOINT_PAUSE, the documented test hook of
grpo_zoo.checkpoint) after its step-2 checkpoint is fully written to `step-000002.tmp` and before
the rename, and SIGKILLed there. The step-1 checkpoint must still load; resuming from it must
reproduce an uninterrupted run's metrics.jsonl and weights bit for bit (CPU).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from grpo_zoo.checkpoint import PAUSE_ENV, latest_checkpoint, load_trainer_state
from grpo_zoo.config import load_config
from grpo_zoo.trainer import train

# Mini/micro batches and the diva selector put optimizer, scheduler and selector state in the checkpoint.
EXTRA = [
    "train.steps=3",
    "output.checkpoint_every=1",
    "output.keep_checkpoints=3",
    "algorithm.estimator=diva",
    "algorithm.selector=diva",
    "train.mini_batch_size=8",
    "train.micro_batch_size=4",
    "model.freeze_vision_tower=false",  # the subprocess reads the default recipe, the in-process runs do not
]


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted((checkpoint / "policy").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def wait_for(path: Path, proc: subprocess.Popen, log: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"training exited ({proc.returncode}) before {path.name}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no {path} after {timeout:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


def test_kill_9_mid_checkpoint_then_resume_is_bit_identical(tiny_model, tmp_path, h):
    part_dir = tmp_path / "part"
    log = tmp_path / "train.log"
    env = {**os.environ, PAUSE_ENV: "2:300", "OMP_NUM_THREADS": "1"}  # as the in-process runs (conftest)
    cmd = [sys.executable, "-m", "grpo_zoo.cli", "train", *h.tiny_overrides(tiny_model, part_dir, *EXTRA)]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        # The reference runs meanwhile (the child spends its first seconds importing).
        full = train(load_config(None, h.tiny_overrides(tiny_model, tmp_path / "full", *EXTRA)), recipe="full")
        wait_for(part_dir / "checkpoints" / "step-000002.tmp" / "meta.json", proc, log)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL

    # The half-published checkpoint is invisible; the previous one loads, policy and trainer state.
    assert (part_dir / "checkpoints" / "step-000002.tmp").is_dir()
    previous = latest_checkpoint(part_dir)
    assert previous is not None and previous.name == "step-000001"
    step, state = load_trainer_state(previous)
    assert step == 1 and {"optimizer", "scheduler", "selector"} <= set(state)
    from grpo_zoo.policy import Policy

    Policy.from_pretrained(str(previous / "policy"))

    resumed = train(load_config(None, h.tiny_overrides(tiny_model, part_dir, *EXTRA)), "part", resume=str(part_dir))
    assert resumed.steps == 3
    assert h.comparable(part_dir) == h.comparable(full.run_dir)
    a, b = weights(full.checkpoint), weights(resumed.checkpoint)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (part_dir / "checkpoints" / "step-000002.tmp").exists()  # cleaned up by the resumed run
