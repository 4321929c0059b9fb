"""The testbed vision tower's pre-training: targets, token order, and that it trains the tower alone."""

from __future__ import annotations

import pytest
import torch

from grpo_zoo.testbed import task
from grpo_zoo.testbed.task import SceneSpec, Shape, render_scene
from grpo_zoo.testbed.vision_pretrain import CHANNELS, cell_targets, image_tokens, pretrain_vision


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from grpo_zoo.testbed.tiny_model import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture
def policy(tiny_model):
    from grpo_zoo.policy import Policy

    return Policy.from_pretrained(str(tiny_model))


def _scene(*shapes: Shape) -> SceneSpec:
    return SceneSpec(tuple(shapes), (240, 240, 240))


def test_cell_targets_count_centres_per_cell_and_channel():
    scene = _scene(Shape("circle", "red", 2, 2, 20),  # centre (12, 12): cell 0
                   Shape("square", "blue", 90, 2, 20),  # centre (100, 12): cell 3
                   Shape("circle", "blue", 86, 88, 20))  # centre (96, 98): cell 15
    t = cell_targets(scene, 4)
    assert t.shape == (16, len(CHANNELS))
    total, red, blue, circles = (CHANNELS.index(c) for c in ("", "red", "blue", "circles"))
    assert t[:, total].tolist() == [1, 0, 0, 1] + [0] * 11 + [1]
    assert t[0, red] == 1 and t[0, circles] == 1 and t[3, blue] == 1 and t[15, circles] == 1 and t[3, circles] == 0
    assert t.sum(0)[total] == 3 == t[:, [CHANNELS.index(p) for p in task.PLURAL.values()]].sum()


def test_token_order_matches_cell_order(policy):
    """A shape moved from cell 0 to cell 15 changes token 0 and token 15 the most (row-major merger order)."""
    blank = render_scene(_scene())
    corner = render_scene(_scene(Shape("square", "red", 4, 4, 20)))
    far = render_scene(_scene(Shape("square", "red", 88, 88, 20)))
    with torch.no_grad():
        base, a, b = image_tokens(policy, [blank, corner, far])
    assert int((a - base).norm(dim=-1).argmax()) == 0
    assert int((b - base).norm(dim=-1).argmax()) == 15


def test_pretrain_vision_trains_only_the_tower(policy):
    text_before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if ".visual." not in f".{n}"}
    vision_before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if ".visual." in f".{n}"}
    lines: list[str] = []
    report = pretrain_vision(policy, steps=3, batch_size=4, lr=1e-3, seed=0, log=lines.append)
    params = dict(policy.model.named_parameters())
    assert all(torch.equal(params[n], p) for n, p in text_before.items())
    assert any(not torch.equal(params[n], p) for n, p in vision_before.items())
    assert report["steps"] == 3 and len(report["loss_curve"]) == 3 and 0.0 <= report["count_accuracy"] <= 1.0
    assert all(torch.isfinite(torch.tensor(report["loss_curve"])))
    assert any("step 3/3" in line for line in lines) and any("held-out scenes" in line for line in lines)
    assert pretrain_vision(policy, steps=0, batch_size=4, lr=1e-3, seed=0) == {"steps": 0}
