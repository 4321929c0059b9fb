"""End-to-end engine tests on a tiny random Qwen2.5-VL-architecture model (no warm-up, no download)."""

import json

import pytest
import torch

from grpo_zoo.config import load_config
from grpo_zoo.configuration import ConfigError
from grpo_zoo.registry import ESTIMATORS, LOSSES, SELECTORS
from grpo_zoo.trainer import train


def tiny_overrides(model_dir, out_dir, *extra):
    return [
        f"model.path={model_dir}",
        "testbed.train_questions=48",
        "testbed.eval_questions=8",
        "rollout.group_size=4",
        "rollout.max_new_tokens=6",
        "train.steps=2",
        "train.questions_per_step=2",
        "eval.num_questions=8",
        "eval.samples=2",
        "eval.every=0",
        "output.tensorboard=false",
        "output.progress=false",
        "reward.num_workers=0",
        f"output.dir={out_dir}",
        *extra,
    ]


def weights(run_dir, step):
    from safetensors.torch import load_file

    files = sorted((run_dir / "checkpoints" / f"step-{step:06d}" / "policy").glob("*.safetensors"))
    out = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("selector", SELECTORS.names())
@pytest.mark.parametrize("estimator", ESTIMATORS.names())
def test_every_estimator_selector_pair_trains(tiny_model, tmp_path, estimator, selector):
    overrides = tiny_overrides(
        tiny_model,
        tmp_path / "run",
        f"algorithm.estimator={estimator}",
        f"algorithm.selector={selector}",
        "train.lr=1e-2",
        "eval.at_start=false",
    )
    cfg = load_config(None, overrides)
    result = train(cfg, recipe="pair")
    steps = [r for r in records(result.run_dir) if r["step"] > 0]
    assert len(steps) == 2
    if selector == "dapo_filter":  # a random model may give no group with mixed accuracy: skipped, counted
        steps = [r for r in steps if "train/loss" in r]
        assert all(r.get("train/skipped_steps", 0) == 0 for r in steps)
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in steps)
    before = {}
    from safetensors.torch import load_file

    for f in sorted((tiny_model).glob("*.safetensors")):
        before.update(load_file(str(f)))
    after = weights(result.run_dir, 2)
    changed = [k for k in after if k in before and not torch.equal(after[k], before[k])]
    # An all-equal batch can legitimately give zero advantages; the loss must still be finite.
    if any(abs(r["advantage/abs_mean"]) > 0 for r in steps):
        assert changed, "parameters did not change after two steps with non-zero advantages"


@pytest.mark.parametrize("loss", LOSSES.names())
def test_every_loss_trains(tiny_model, tmp_path, loss):
    cfg = load_config(
        None, tiny_overrides(tiny_model, tmp_path / "run", f"algorithm.loss={loss}", "eval.at_start=false")
    )
    result = train(cfg, recipe="loss")
    steps = [r for r in records(result.run_dir) if "train/loss" in r]
    assert len(steps) == 2 and all(r["train/loss"] is not None for r in steps)


def test_resume_is_bit_identical(tiny_model, tmp_path):
    # Mini/micro batches and the diva selector exercise optimizer, scheduler and selector state.
    extra = [
        "output.checkpoint_every=2",
        "algorithm.estimator=diva",
        "algorithm.selector=diva",
        "train.mini_batch_size=8",
        "train.micro_batch_size=4",
        "eval.num_questions=0",
    ]
    full = train(load_config(None, tiny_overrides(tiny_model, tmp_path / "full", *extra, "train.steps=4")), "full")
    part = train(load_config(None, tiny_overrides(tiny_model, tmp_path / "part", *extra, "train.steps=2")), "part")
    resumed_cfg = load_config(None, tiny_overrides(tiny_model, tmp_path / "part", *extra, "train.steps=4"))
    train(resumed_cfg, recipe="part", resume=str(part.run_dir))

    def comparable(run_dir):
        out = []
        for r in records(run_dir):
            out.append({k: v for k, v in r.items() if not k.startswith("time/")})
        return out

    assert comparable(full.run_dir) == comparable(part.run_dir)
    a, b = weights(full.run_dir, 4), weights(part.run_dir, 4)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_group_size_one_is_caught_before_training(tiny_model, tmp_path):
    cfg = load_config(None, tiny_overrides(tiny_model, tmp_path / "run", "rollout.group_size=1"))
    with pytest.raises(ConfigError, match="group_size"):
        train(cfg, recipe="bad")


def test_missing_model_path_is_clear(tmp_path):
    cfg = load_config(None, [f"model.path={tmp_path / 'nope'}", f"output.dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match="not a local Hugging Face model directory"):
        train(cfg, recipe="bad")


def test_cpu_budget_counts_training_steps_not_evals(tiny_model, tmp_path, monkeypatch):
    """train.max_cpu_seconds is equal compute per arm: held-out evals (here made to burn 2 s of CPU
    each) are not charged to it, so an arm with cheaper steps (more evals per budget) is not taxed."""
    import time

    from grpo_zoo import trainer

    real_evaluate = trainer.evaluate

    def slow_evaluate(*args, **kwargs):
        end = time.process_time() + 2.0
        while time.process_time() < end:
            pass
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(trainer, "evaluate", slow_evaluate)
    cfg = load_config(None, tiny_overrides(tiny_model, tmp_path / "run", "train.steps=3", "eval.every=1",
                                           "eval.at_start=false"))
    result = train(cfg, recipe="budget")
    rows = [r for r in records(result.run_dir) if "time/cpu_s" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    step_cpu = [b["time/cpu_s"] - a["time/cpu_s"] for a, b in zip(rows, rows[1:])]
    assert all(0 < c < 1.5 for c in step_cpu), step_cpu  # a step (~0.5 s) without its eval (>= 2 s)
    # The budget stops the run on training CPU: a budget below one step's cost ends it after one step.
    monkeypatch.setattr(trainer, "evaluate", real_evaluate)
    cfg = load_config(None, tiny_overrides(tiny_model, tmp_path / "run2", "train.steps=3", "eval.every=1",
                                           f"train.max_cpu_seconds={rows[0]['time/cpu_s'] / 2}"))
    assert train(cfg, recipe="budget").steps == 1


def test_the_step_that_spends_the_cpu_budget_is_evaluated_and_checkpointed(tiny_model, tmp_path):
    """A budget that ends a run between eval points still measures where it ended: every arm's
    final metric is read at its last step, not up to eval.every - 1 steps earlier."""
    cfg = load_config(None, tiny_overrides(tiny_model, tmp_path / "run", "train.steps=10", "eval.every=5",
                                           "output.checkpoint_every=5", "train.max_cpu_seconds=0.01"))
    result = train(cfg, recipe="budget")
    assert result.steps == 1
    last = [r for r in records(result.run_dir) if r["step"] == 1]
    assert len(last) == 1 and "eval/pass@1" in last[0] and "time/cpu_s" in last[0]
    assert (result.run_dir / "checkpoints" / "step-000001").is_dir()


def test_a_new_run_refuses_a_directory_that_holds_one(tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    cfg = load_config(None, tiny_overrides(tiny_model, run_dir))
    with pytest.raises(ConfigError, match="--resume"):
        train(cfg, recipe="again")
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 0}\n'  # the old run's records are untouched


def test_eval_breaks_pass_at_1_down_by_a_question_column(tiny_model, tmp_path, capsys):
    from grpo_zoo.data import load_questions

    cfg = load_config(None, tiny_overrides(tiny_model, tmp_path / "run", "train.steps=1", "eval.by=[tier]"))
    result = train(cfg, recipe="by")
    pool, _ = load_questions(cfg.data.eval, cfg.data, cfg.testbed, "eval")
    tiers = [str(q.extras["tier"]) for q in pool[: cfg.eval.num_questions]]
    first = records(result.run_dir)[0]
    assert {k.split("/")[1] for k in first if k.count("/") == 2} == {f"tier={t}" for t in tiers}
    for name in ("pass@1", "greedy_accuracy"):  # the slices, weighted by their question counts, are the whole
        whole = sum(tiers.count(t) * first[f"eval/tier={t}/{name}"] for t in set(tiers)) / len(tiers)
        assert whole == pytest.approx(first[f"eval/{name}"])
    out = capsys.readouterr().out
    assert "    pass@1 by tier: " in out and "  pass@1 by tier: " in result.summary()


def test_eval_by_a_column_the_eval_set_lacks_is_clear(tiny_model, tmp_path):
    cfg = load_config(None, tiny_overrides(tiny_model, tmp_path / "run", "eval.by=[subject]"))
    with pytest.raises(ConfigError, match=r"no held-out question .* 'subject'; its columns are \[.*'tier'"):
        train(cfg, recipe="bad")
    with pytest.raises(ConfigError, match="eval.by"):
        load_config(None, ["eval.by=[tier, tier]"])
