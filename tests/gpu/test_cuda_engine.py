"""The engine on a CUDA device: training steps in float32 and bfloat16, with LoRA and gradient checkpointing.

Prefix sharing on CUDA is checked beside its CPU tests (tests/engine/test_shared_prompts.py). Opt in
with `python -m pytest -m gpu` on a machine with a GPU; skipped everywhere else.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from grpo_zoo.config import load_config
from grpo_zoo.registry import REWARDS
from grpo_zoo.trainer import train

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from grpo_zoo.testbed.tiny_model import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def _digit_share(response: str, answer: str, **context) -> float:
    """A reward a random model's text varies on (its share of digits), so every group has an advantage."""
    return sum(c.isdigit() for c in response) / max(len(response), 1)


if "gpu_test_digit_share" not in REWARDS.names():
    REWARDS.register("gpu_test_digit_share")(_digit_share)


def _overrides(model_dir, out_dir, *extra):
    return [f"model.path={model_dir}", "model.device=cuda", "testbed.train_questions=48", "testbed.eval_questions=8",
            "rollout.group_size=4", "rollout.max_new_tokens=6", "train.steps=2", "train.questions_per_step=2",
            "train.lr=1e-2", "eval.num_questions=8", "eval.samples=2", "eval.every=2", "output.tensorboard=false",
            "output.progress=false", "reward.num_workers=0",
            "reward.functions=[{name: gpu_test_digit_share, weight: 1.0}]",
            "reward.accuracy_function=gpu_test_digit_share",
            f"output.dir={out_dir}", *extra]


def _weights(directory):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("extra", [
    [],
    ["model.prefix_sharing=false"],
    ["model.dtype=bfloat16", "model.gradient_checkpointing=true"],
    ["model.dtype=bfloat16", "model.lora.enabled=true", "model.lora.r=4"],
], ids=["float32", "float32-no-sharing", "bf16-checkpointing", "bf16-lora"])
def test_training_steps_run_on_cuda_and_change_the_weights(tiny_model, tmp_path, extra):
    result = train(load_config(None, _overrides(tiny_model, tmp_path / "run", "algorithm.estimator=diva",
                                                "algorithm.selector=diva", *extra)), recipe="gpu")
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/loss" in r]
    assert len(steps) == 2 and all(np.isfinite(r["train/loss"]) for r in steps)
    assert any("eval/pass@1" in r for r in records), "the held-out eval did not run"
    before = _weights(tiny_model)
    after = _weights(result.run_dir / "checkpoints" / "step-000002" / "policy")
    changed = [k for k in after if k in before and not torch.equal(after[k], before[k].to(after[k].dtype))]
    assert changed, "two steps on the GPU changed no weight"
