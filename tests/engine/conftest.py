"""Fixtures shared by the engine tests: a tiny random Qwen2.5-VL checkpoint (seconds to build) and its policy."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from grpo_zoo.testbed.tiny_model import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def policy(tiny_model):
    from grpo_zoo.policy import Policy

    return Policy.from_pretrained(str(tiny_model))
