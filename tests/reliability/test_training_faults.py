"""Faults inside a training run (issue #7), end to end on the tiny random VLM.

- A non-finite loss skips the update (logged, counted), the weights stay as they were, and no
  checkpoint ever holds a NaN.
- A dataset with bad rows trains: the rows are skipped before any batch is drawn (so none
  poisons one), and their counts reach metrics.jsonl; a user reward that raises scores 0 and
  is counted in every step's metrics.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from safetensors.torch import load_file

import grpo_zoo.trainer as trainer
from grpo_zoo.config import load_config


def weights(checkpoint) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted((checkpoint / "policy").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def parity_reward(response: str, answer: str, **context: object) -> float:
    """Varies within a group of a random model's responses, so advantages (and updates) are non-zero."""
    return float(len(response) % 2)


@pytest.mark.parametrize("poison", ["scaled", "detached"])  # detached: a NaN loss whose gradients stay finite
def test_nan_loss_skips_the_update_and_never_reaches_the_weights(tiny_model, tmp_path, h, monkeypatch, caplog,
                                                                 poison):
    real_build_run = trainer.build_run

    def build_run_with_nan_loss(*args, **kwargs):
        run = real_build_run(*args, **kwargs)
        real_loss = run.loss.obj

        def nan_at_step_1(inputs, cfg):
            out = real_loss(inputs, cfg)
            if inputs.seed == 1:  # LossInputs.seed = train.seed * 1_000_003 + step, train.seed = 0
                nan = torch.tensor(float("nan"))
                out = dataclasses.replace(out, loss=out.loss * nan if poison == "scaled" else out.loss + nan)
            return out

        run.loss = dataclasses.replace(run.loss, obj=nan_at_step_1)
        return run

    monkeypatch.setattr(trainer, "build_run", build_run_with_nan_loss)
    overrides = h.tiny_overrides(
        tiny_model, tmp_path / "run", "train.steps=3", "output.checkpoint_every=1", "output.keep_checkpoints=3",
        f"reward.functions=[{{name: accuracy, weight: 0.5}}, {{name: '{__name__}:parity_reward', weight: 0.5}}]",
    )
    with caplog.at_level(logging.WARNING, logger="grpo_zoo.trainer"):
        result = trainer.train(load_config(None, overrides), recipe="nan")
    steps = {r["step"]: r for r in h.records(result.run_dir) if "train/skipped_updates" in r}
    assert steps[1]["train/skipped_updates"] == 0 and steps[3]["train/skipped_updates"] == 0
    assert steps[2]["train/skipped_updates"] == 1  # the step whose loss was NaN
    # The warning names the cause: the loss, while the policy's log-probs themselves were finite.
    assert "update skipped" in caplog.text and "loss(es) not finite" in caplog.text
    assert "not finite on 0 response tokens" in caplog.text
    ckpts = result.run_dir / "checkpoints"
    one, two, three = (weights(ckpts / f"step-00000{i}") for i in (1, 2, 3))
    assert any(r["advantage/abs_mean"] > 0 for r in steps.values())  # the updates had something to move
    assert all(torch.equal(one[k], two[k]) for k in one)  # the skipped update changed nothing
    assert any(not torch.equal(two[k], three[k]) for k in two)  # training went on afterwards
    assert all(torch.isfinite(t).all() for t in three.values())


def broken_reward(response: str, answer: str, **context: object) -> float:
    """A user reward with a bug: it raises on every response."""
    raise RuntimeError("a bug in the user's reward")


def test_bad_rows_and_a_raising_reward_do_not_stop_training(tiny_model, tmp_path, h):
    good = [{"problem": f"<image>How many shapes? {i}", "answer": str(i % 5), "images": [f"img/{i % 2}.png"]}
            for i in range(18)]
    bad = [
        {"problem": "<image>q", "answer": "1", "images": ["img/corrupt.png"]},
        {"problem": "<image>q", "answer": "", "images": ["img/0.png"]},
    ]
    (tmp_path / "img").mkdir()
    for i in range(2):
        (tmp_path / "img" / f"{i}.png").write_bytes(h.png_bytes(112, 112, ["red", "blue"][i]))
    (tmp_path / "img" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    data = h.write_jsonl(tmp_path / "train.jsonl", good[:9] + bad + good[9:])
    overrides = h.tiny_overrides(
        tiny_model, tmp_path / "run",
        f"data.train={data}", f"data.eval={data}", "data.max_bad_row_share=0.2",
        f"reward.functions=[{{name: accuracy, weight: 0.5}}, {{name: '{__name__}:broken_reward', weight: 0.5}}]",
    )
    result = trainer.train(load_config(None, overrides), recipe="bad-rows")
    records = h.records(result.run_dir)
    first = records[0]
    assert first["step"] == 0 and first["data/train_rows"] == 20 and first["data/train_skipped"] == 2
    assert first["data/train_skipped_corrupt_image"] == 1 and first["data/train_skipped_empty_answer"] == 1
    steps = [r for r in records if "train/loss" in r]
    assert len(steps) == 2 and all(r["train/loss"] is not None for r in steps)
    for r in steps:  # every response of every step: scored 0 for that function, counted, training goes on
        assert r[f"reward/{__name__}:broken_reward_errors"] == r["reward/errors"] == r["rollout/responses"] == 8
