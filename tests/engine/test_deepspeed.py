"""`train.backend: deepspeed` on CPU with gloo (the tiny random model), and the 7B recipes.

The DeepSpeed tests skip when deepspeed is not installed (pip install -e .[test]); the recipe
checks always run.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_zoo.config import load_config
from grpo_zoo.trainer import train

ROOT = Path(__file__).resolve().parents[2]
RECIPES_7B = sorted((ROOT / "configs" / "qwen2_5_vl_7b").glob("*.yaml"))
ARMS_7B = {"grpo", "dapo", "gspo", "durian", "vade", "diva"}


def needs_deepspeed():
    pytest.importorskip("deepspeed", reason="the [deepspeed] extra is not installed")


def length_reward(response: str, answer: str, **context: object) -> float:
    """Test only: longer responses score higher, so a random tiny model still gets non-zero advantages."""
    return min(len(response), 20) / 20


REWARDS = f"reward.functions=[{{name: accuracy, weight: 0.5}}, {{name: '{__name__}:length_reward', weight: 0.5}}]"


def overrides(model_dir, out_dir, *extra):
    return [
        f"model.path={model_dir}",
        REWARDS,
        "testbed.train_questions=48",
        "testbed.eval_questions=8",
        "rollout.group_size=4",
        "rollout.max_new_tokens=6",
        "train.steps=2",
        "train.questions_per_step=2",
        "train.mini_batch_size=4",
        "train.micro_batch_size=2",
        "train.lr=1e-3",
        "eval.num_questions=0",
        "output.tensorboard=false",
        "output.progress=false",
        "output.checkpoint_every=2",
        "reward.num_workers=0",
        f"output.dir={out_dir}",
        *extra,
    ]


DS = ["train.backend=deepspeed", "train.deepspeed.zero_stage=2"]


def weights(checkpoint):
    from safetensors.torch import load_file

    out = {}
    for f in sorted((checkpoint / "policy").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def comparable(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records(run_dir)]


def test_zero2_trains_resumes_and_stays_loadable_by_plain(tiny_model, tmp_path):
    needs_deepspeed()
    full = train(load_config(None, overrides(tiny_model, tmp_path / "full", *DS, "train.steps=3")), "full")
    part = train(load_config(None, overrides(tiny_model, tmp_path / "part", *DS)), "part")
    train(load_config(None, overrides(tiny_model, tmp_path / "part", *DS, "train.steps=3")), "part",
          resume=str(part.run_dir))

    # Trains: finite losses and gradients, with something to learn.
    steps = [r for r in records(full.run_dir) if "train/loss" in r]
    assert len(steps) == 3 and all(r["train/grad_norm"] is not None for r in steps)
    assert all(r["advantage/abs_mean"] > 0 and r["train/grad_norm"] > 0 for r in steps)
    a, b = weights(full.checkpoint), weights(tmp_path / "part" / "checkpoints" / "step-000003")
    # Resumes exactly: optimizer state, scheduler and selector all came back.
    assert comparable(full.run_dir) == comparable(part.run_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # Nothing pickled: the checkpoint is safetensors + JSON, optimizer in torch AdamW's layout.
    ckpt = full.checkpoint
    assert not list(ckpt.rglob("*.pt")) and not list(ckpt.rglob("*.bin")) and not list(ckpt.rglob("*.pkl"))
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert set(state["optimizer"]) == {"state", "param_groups"} and state["optimizer"]["state"]

    # The plain backend resumes from the DeepSpeed checkpoint (weights and optimizer state).
    plain_dir = tmp_path / "plain"
    shutil.copytree(full.run_dir, plain_dir)
    resumed = train(load_config(None, overrides(tiny_model, plain_dir, "train.steps=4")), "plain",
                    resume=str(plain_dir))
    assert resumed.steps == 4 and all(r.get("train/loss") is not None for r in records(plain_dir) if r["step"] == 4)


def test_zero2_one_process_matches_plain_first_step(tiny_model, tmp_path):
    needs_deepspeed()
    ds = train(load_config(None, overrides(tiny_model, tmp_path / "ds", *DS, "train.steps=1")), "ds")
    plain = train(load_config(None, overrides(tiny_model, tmp_path / "plain", "train.steps=1")), "plain")
    r_ds, r_plain = records(ds.run_dir)[-1], records(plain.run_dir)[-1]
    # Same rollout; the ZeRO update equals torch AdamW's up to rounding (the second mini-batch's
    # loss already sees the first update, so it agrees to rounding too).
    assert r_ds["reward/mean"] == r_plain["reward/mean"]
    assert r_ds["train/loss"] == pytest.approx(r_plain["train/loss"], rel=1e-4)
    assert r_ds["train/grad_norm"] == pytest.approx(r_plain["train/grad_norm"], rel=1e-4)
    a, b = weights(ds.checkpoint), weights(plain.checkpoint)
    start = weights_of(tiny_model)
    assert any(not torch.equal(a[k], start[k]) for k in a)  # the update moved the weights
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def weights_of(model_dir):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_zero2_skips_a_non_finite_update(tiny_model, tmp_path, monkeypatch):
    needs_deepspeed()
    import dataclasses

    from grpo_zoo import trainer

    real_build_run = trainer.build_run

    def build_run_with_nan_loss(*args, **kwargs):
        run = real_build_run(*args, **kwargs)
        real_loss = run.loss.obj

        def nan_at_step_1(inputs, cfg):
            out = real_loss(inputs, cfg)
            return dataclasses.replace(out, loss=out.loss * float("nan")) if inputs.seed == 1 else out

        run.loss = dataclasses.replace(run.loss, obj=nan_at_step_1)
        return run

    monkeypatch.setattr(trainer, "build_run", build_run_with_nan_loss)
    cfg = load_config(None, overrides(tiny_model, tmp_path / "run", *DS, "train.steps=2", "train.mini_batch_size=0",
                                      "output.checkpoint_every=1", "output.keep_checkpoints=3"))
    result = trainer.train(cfg, recipe="nan")
    steps = {r["step"]: r for r in records(result.run_dir) if "train/skipped_updates" in r}
    assert steps[1]["train/skipped_updates"] == 0 and steps[2]["train/skipped_updates"] == 1
    one, two = (weights(result.run_dir / "checkpoints" / f"step-00000{i}") for i in (1, 2))
    assert all(torch.equal(one[k], two[k]) for k in one)  # the skipped update changed nothing


def test_zero_config_errors_are_clear():
    with pytest.raises(Exception, match="offload_params needs zero_stage 3"):
        load_config(None, ["train.backend=deepspeed", "train.deepspeed.offload_params=true"])
    with pytest.raises(Exception, match="zero_stage must be 1, 2 or 3"):
        load_config(None, ["train.deepspeed.zero_stage=4"])


@pytest.mark.slow
def test_torchrun_two_processes_train_and_resume(tiny_model, tmp_path):
    needs_deepspeed()
    grpo_zoo = shutil.which("grpo-zoo")
    assert grpo_zoo, "the grpo-zoo console script is not installed (pip install -e .)"
    run_dir = tmp_path / "dp"
    base = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", grpo_zoo, "train"]
    here = str(Path(__file__).resolve().parent)  # length_reward's module, however pytest named it
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), here])}
    args = overrides(tiny_model, run_dir, *DS)
    subprocess.run([*base, *args], check=True, env=env, timeout=600)
    subprocess.run([*base, *overrides(tiny_model, run_dir, *DS, "train.steps=3"), "--resume", str(run_dir)],
                   check=True, env=env, timeout=600)
    rows = records(run_dir)
    trained = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in trained] == [1, 2, 3]  # rank 0 alone writes: no duplicate lines
    # The CLI's default recipe is DIVA: 2 questions + 2 variants x G = 4. Each rank sampled half
    # of the prompts; the gathered batch has all of them.
    assert all(r["rollout/responses"] == 16 for r in trained)
    assert all(r["advantage/abs_mean"] > 0 and r["train/grad_norm"] > 0 for r in trained)
    assert (run_dir / "checkpoints" / "step-000003" / "policy" / "config.json").is_file()


# --------------------------------------------------------------------------------------
# The Qwen2.5-VL-7B recipes (no model, no GPU, no deepspeed needed)
# --------------------------------------------------------------------------------------


def test_every_7b_arm_has_a_recipe():
    assert {p.stem for p in RECIPES_7B} >= ARMS_7B


@pytest.mark.parametrize("path", RECIPES_7B, ids=lambda p: p.stem)
def test_7b_recipe_validates_with_the_diva_paper_settings(path):
    from grpo_zoo.cli import main

    assert main(["validate", str(path)]) == 0
    cfg = load_config(path)
    assert cfg.rollout.group_size == 5 and cfg.rollout.backend == "vllm"
    assert cfg.train.lr == 1e-6 and cfg.train.lr_schedule == "constant" and cfg.train.kl_coef == 0
    assert [(f.name, f.weight) for f in cfg.reward.functions] == [("accuracy", 0.9), ("format", 0.1)]
    assert cfg.model.dtype == "bfloat16" and cfg.train.backend == "deepspeed"
    prompts = cfg.train.questions_per_step
    if cfg.algorithm.selector.name == "diva":
        prompts *= 1 + cfg.algorithm.selector.config.num_variants
        assert cfg.train.questions_per_step == 64
    assert prompts * cfg.rollout.group_size == 640  # equal responses per step across arms
