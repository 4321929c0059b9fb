"""Rollout correction (ALGORITHMS.md): TIS on by default for an external sampler, off for hf; mismatch logged.

The external sampler is the hf backend with `external_sampler = True` whose reported log-probs
are the trainer's own, perturbed: the protocol a vLLM engine follows (sampler_logprobs [N, T],
0 where masked), with numerics that drift from the trainer's.
"""

import json
import logging

import pytest
import torch

import grpo_zoo.backends.rollout as rollout_module
from grpo_zoo.algorithms.loss_utils import DEFAULT_TIS_CAP, TIS_AUTO, resolve_tis_cap
from grpo_zoo.backends.rollout import HfRollout
from grpo_zoo.config import load_config
from grpo_zoo.run import apply_rollout_correction
from grpo_zoo.trainer import train

NOISE = 0.05  # std of the sampler's log-prob drift, per token


class DriftingSampler(HfRollout):
    """hf sampling that reports log-probs like an external engine: the trainer's plus noise."""

    external_sampler = True

    def generate(self, encoded, sampling, *, version):
        batch = super().generate(encoded, sampling, version=version)
        with torch.no_grad():
            logp, _ = self.policy.logprobs(batch, torch.arange(batch.num_responses))  # [N, T]
        noise = torch.randn(logp.shape, generator=torch.Generator().manual_seed(version)) * NOISE
        batch.sampler_logprobs = (logp.detach().cpu() + noise) * batch.response_mask  # 0 where masked
        return batch


@pytest.fixture
def external(monkeypatch):
    """Make build_run use DriftingSampler whatever rollout.backend says."""
    monkeypatch.setattr(rollout_module, "make_rollout_backend", lambda cfg, policy, path: DriftingSampler(policy))


def tiny_config(model_dir, out_dir, *extra):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            "testbed.train_questions=16",
            "testbed.eval_questions=4",
            "rollout.group_size=4",
            "rollout.max_new_tokens=6",
            "train.steps=2",
            "train.questions_per_step=2",
            "eval.num_questions=0",
            "eval.at_start=false",
            "output.tensorboard=false",
            "output.progress=false",
            "reward.num_workers=0",
            f"output.dir={out_dir}",
            *extra,
        ],
    )


def step_records(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "train/loss" in r]


def test_resolve_tis_cap():
    assert resolve_tis_cap(TIS_AUTO, external_sampler=True) == DEFAULT_TIS_CAP == 2.0
    assert resolve_tis_cap(TIS_AUTO, external_sampler=False) is None
    assert resolve_tis_cap(3.0, external_sampler=False) == 3.0
    assert resolve_tis_cap(None, external_sampler=True) is None


@pytest.mark.parametrize("setting, want", [("3.0", 3.0), ("null", None)])
def test_explicit_setting_is_kept_for_an_external_sampler(setting, want):
    cfg = load_config(None, ["algorithm.loss.name=cispo", f"algorithm.loss.tis_cap={setting}"])
    apply_rollout_correction(cfg, DriftingSampler(policy=None))
    assert cfg.algorithm.loss.config.tis_cap == want


def test_a_loss_without_tis_cap_is_left_alone():
    cfg = load_config(None, [])
    cfg.algorithm.loss.config = object()  # a third-party loss config with no tis_cap field
    apply_rollout_correction(cfg, DriftingSampler(policy=None))  # no AttributeError
    assert not hasattr(cfg.algorithm.loss.config, "tis_cap")


def test_external_sampler_turns_tis_on_and_logs_the_mismatch_every_step(tiny_model, tmp_path, external, caplog):
    cfg = tiny_config(tiny_model, tmp_path / "run")
    assert cfg.algorithm.loss.config.tis_cap == TIS_AUTO
    with caplog.at_level(logging.WARNING, logger="grpo_zoo.run"):
        result = train(cfg, recipe="external")
    assert cfg.algorithm.loss.config.tis_cap == DEFAULT_TIS_CAP
    notes = [r.getMessage() for r in caplog.records if "rollout correction" in r.getMessage()]
    assert len(notes) == 1 and "tis_cap = 2.0" in notes[0]
    steps = step_records(result.run_dir)
    assert len(steps) == 2
    for r in steps:
        # |noise| has mean NOISE * sqrt(2 / pi); the trainer's pre-update pass matches the sampler's base.
        assert r["rollout/logprob_mismatch"] == pytest.approx(NOISE * (2 / torch.pi) ** 0.5, rel=0.35)
        assert 0 < r["rollout/tis_weight_mean"] <= DEFAULT_TIS_CAP
        assert "rollout/importance_weight_mean" in r and "rollout/tis_capped_fraction" in r
        assert "train/tis_weight_mean" in r  # the loss applied the truncated weights


def test_explicit_cap_is_used_by_the_loss(tiny_model, tmp_path, external, caplog):
    cfg = tiny_config(tiny_model, tmp_path / "run", "algorithm.loss.name=ppo_clip", "algorithm.loss.tis_cap=1.01",
                      "train.steps=1")
    with caplog.at_level(logging.WARNING, logger="grpo_zoo.run"):
        result = train(cfg, recipe="explicit")
    assert cfg.algorithm.loss.config.tis_cap == 1.01
    assert not [r for r in caplog.records if "rollout correction" in r.getMessage()]
    (r,) = step_records(result.run_dir)
    assert r["rollout/tis_capped_fraction"] > 0  # a tight cap binds on some tokens
    assert r["rollout/tis_weight_mean"] <= 1.01


def test_hf_keeps_tis_off_and_logs_no_mismatch(tiny_model, tmp_path):
    cfg = tiny_config(tiny_model, tmp_path / "run")
    result = train(cfg, recipe="hf")
    assert cfg.algorithm.loss.config.tis_cap is None
    steps = step_records(result.run_dir)
    assert len(steps) == 2
    for r in steps:
        assert not [k for k in r if "mismatch" in k or "tis_" in k or k.startswith("rollout/importance")]
