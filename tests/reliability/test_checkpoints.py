"""Checkpoints (issue #7): atomic (a crash at any point leaves the previous one loadable), never
NaN weights, and loaded without unpickling (safetensors + JSON), with state types preserved.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from grpo_zoo import checkpoint as ckpt
from grpo_zoo.checkpoint import NonFiniteWeights, latest_checkpoint, load_trainer_state, save_checkpoint
from grpo_zoo.state_io import load_state, save_state


class TinyPolicy:
    """Stands in for grpo_zoo.policy.Policy: a model and a save() that writes safetensors."""

    def __init__(self, value: float = 1.0):
        self.model = torch.nn.Linear(3, 2)
        with torch.no_grad():
            self.model.weight.fill_(value)

    def save(self, path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.model.state_dict().items()}, str(path / "model.safetensors"))
        return path


def saved_weight(checkpoint: Path) -> float:
    return float(load_file(str(checkpoint / "policy" / "model.safetensors"))["weight"][0, 0])


def state(step: int) -> dict:
    return {"counters": {"step": step}, "optimizer": {"state": {0: {"exp_avg": torch.full((2,), float(step))}}}}


def test_round_trip_keeps_types():
    shared = torch.arange(4.0)
    original = {
        "int_keys": {3: "a", 10: {"x": 1}},  # question ids: must not come back as "3", "10"
        "tuple_keys": {(1, 2): 0.5},
        "tuple": (1, "b", None),
        "rng": ("MT19937", np.arange(5, dtype=np.uint32), 3, 0, 0.0),
        "arrays": [np.array([True, False]), np.float32(2.5), np.arange(3, dtype=np.int16)],
        "same_tensor_twice": [shared, shared],  # safetensors refuses shared memory: stored as copies
        "a/b": torch.zeros(1),
        "a": {"b": torch.ones(1)},  # the same tensor key as "a/b" above
        "scalar": torch.tensor(7),
        "nan": float("nan"),
        "reserved": {"__tensor__": "not a tensor"},
    }
    loaded = load_state_round_trip(original)
    assert loaded["int_keys"] == {3: "a", 10: {"x": 1}}
    assert loaded["tuple_keys"] == {(1, 2): 0.5}
    assert loaded["tuple"] == (1, "b", None)
    assert loaded["rng"][0] == "MT19937" and loaded["rng"][1].dtype == np.uint32
    assert loaded["rng"][1].tolist() == [0, 1, 2, 3, 4]
    assert loaded["arrays"][0].dtype == np.bool_ and loaded["arrays"][1] == 2.5
    assert torch.equal(loaded["same_tensor_twice"][0], shared) and torch.equal(loaded["same_tensor_twice"][1], shared)
    assert loaded["a/b"].item() == 0.0 and loaded["a"]["b"].item() == 1.0
    assert loaded["scalar"].item() == 7 and np.isnan(loaded["nan"])
    assert loaded["reserved"] == {"__tensor__": "not a tensor"}


def load_state_round_trip(obj: dict) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        save_state(obj, directory, "s")
        return load_state(directory, "s")


@pytest.mark.parametrize("value", [object(), np.array(["a"], dtype=object), {1, 2}])
def test_unsaveable_values_are_named(value):
    with pytest.raises(TypeError, match="at 's/bad"):
        load_state_round_trip({"bad": value})


def test_kill_during_write_leaves_previous_loadable(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 2, TinyPolicy(2.0), state(2))

    def die(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing the trainer state")

    monkeypatch.setattr(ckpt, "save_state", die)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 4, TinyPolicy(4.0), state(4))
    monkeypatch.undo()
    assert (tmp_path / "checkpoints" / "step-000004.tmp").is_dir()  # the half-written one stays invisible
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "step-000002" and saved_weight(latest) == 2.0
    assert load_trainer_state(latest)[0] == 2
    save_checkpoint(tmp_path, 4, TinyPolicy(4.0), state(4))  # the rerun replaces the leftover
    assert latest_checkpoint(tmp_path).name == "step-000004"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000002", "step-000004"]


def test_kill_while_replacing_the_same_step_keeps_a_complete_copy(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 3, TinyPolicy(3.0), state(3), keep=1)
    real_replace = os.replace
    calls = []

    def replace_then_die(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the old copy is moved aside; die before the new one is published
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 3, TinyPolicy(30.0), state(3), keep=1)
    monkeypatch.undo()
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "step-000003.old" and saved_weight(latest) == 3.0
    save_checkpoint(tmp_path, 5, TinyPolicy(5.0), state(5), keep=1)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-000005"]  # leftovers pruned


def test_non_finite_weights_are_never_written(tmp_path):
    save_checkpoint(tmp_path, 1, TinyPolicy(1.0), state(1))
    with pytest.raises(NonFiniteWeights, match="'weight' is NaN or inf"):
        save_checkpoint(tmp_path, 2, TinyPolicy(float("nan")), state(2))
    assert latest_checkpoint(tmp_path).name == "step-000001"
    assert not (tmp_path / "checkpoints" / "step-000002.tmp").exists()


def test_half_written_or_half_deleted_directories_are_not_checkpoints(tmp_path):
    save_checkpoint(tmp_path, 1, TinyPolicy(), state(1))
    for leftover in ("step-000008.tmp", "step-000009.del", "step-000007.old"):  # .old without meta.json
        (tmp_path / "checkpoints" / leftover).mkdir()
    assert latest_checkpoint(tmp_path).name == "step-000001"
    assert latest_checkpoint(tmp_path / "nowhere") is None
    meta = tmp_path / "checkpoints" / "step-000001" / "meta.json"
    meta.write_text(json.dumps({"step": 1, "format": 99}))
    with pytest.raises(ValueError, match="format 99"):
        load_trainer_state(meta.parent)
    meta.unlink()
    with pytest.raises(ValueError, match="not a complete grpo_zoo checkpoint"):
        load_trainer_state(meta.parent)


def test_checkpoint_loads_without_unpickling(tmp_path, tiny_model, monkeypatch):
    from grpo_zoo.policy import Policy

    policy = Policy.from_pretrained(str(tiny_model))
    optimizer = torch.optim.AdamW(policy.parameters_for_training(), lr=1e-3)
    sum(p.sum() for p in policy.parameters_for_training()).backward()
    optimizer.step()  # Adam moments under int parameter ids: the state that must come back as it was
    path = save_checkpoint(tmp_path, 1, policy, {"optimizer": optimizer.state_dict()})
    assert not [p for p in path.rglob("*") if p.suffix in (".bin", ".pt", ".pth", ".pkl")]

    def no_pickle(*args, **kwargs):
        raise AssertionError("a checkpoint load unpickled something")

    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(pickle, "loads", no_pickle)
    monkeypatch.setattr(torch, "load", no_pickle)
    step, loaded = load_trainer_state(path)
    reloaded = Policy.from_pretrained(str(path / "policy"))
    assert step == 1 and set(loaded["optimizer"]["state"]) == set(optimizer.state_dict()["state"])  # int keys
    for (name, a), b in zip(policy.model.state_dict().items(), reloaded.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_pause_hook_only_at_its_step(monkeypatch):
    slept = []
    monkeypatch.setattr(ckpt.time, "sleep", slept.append)
    monkeypatch.setenv(ckpt.PAUSE_ENV, "4:2.5")
    ckpt._test_pause(2)
    ckpt._test_pause(4)
    assert slept == [2.5]
