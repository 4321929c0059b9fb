"""Ray rollout and reward workers: the same run as one process, and no lost sample when a worker dies.

One local cluster (2 CPUs, an 80 MB object store) serves the module; workers take half a CPU each.
Faults are injected with FAULT_DIR_ENV: a `kill-<kind>` file makes one worker SIGKILL itself
inside its next call (the variable is set before the cluster starts, so every worker sees it).
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from grpo_zoo.backends.rollout import HfRollout, Sampling, concat_rollouts, select_encoded, shard_bounds
from grpo_zoo.config import load_config
from grpo_zoo.configuration import ConfigError
from grpo_zoo.run import check_backends

HALF_CPU = ["distributed.ray.rollout.num_cpus=0.5", "distributed.ray.reward.num_cpus=0.5"]
SAMPLING = Sampling(group_size=3, temperature=1.0, top_p=1.0, max_new_tokens=6)


# ---------------------------------------------------------------------------------- no Ray needed


def test_shard_bounds_are_contiguous_and_balanced():
    assert shard_bounds(5, 2) == [(0, 3), (3, 5)]
    assert shard_bounds(2, 4) == [(0, 1), (1, 2)]  # never an empty block
    assert shard_bounds(0, 3) == []
    with pytest.raises(ValueError, match="shards"):
        shard_bounds(3, 0)


def test_ray_missing_is_a_config_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError, match=r"grpo_zoo\[ray\]"):
        check_backends(load_config(None, ["rollout.backend=ray"]))
    with pytest.raises(ConfigError, match="num_reward_workers"):
        check_backends(load_config(None, ["distributed.ray.num_reward_workers=2"]))


def test_sharded_hf_rollout_concatenates_blocks_in_prompt_order(policy, encoded):
    torch.manual_seed(0)
    batch = HfRollout(policy, shards=2).generate(encoded, SAMPLING, version=3)
    assert batch.policy_version == 3 and batch.num_responses == 3 * len(encoded)
    assert batch.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [p.question_id for p in batch.prompts] == [p.question_id for p in encoded.prompts]
    lengths = batch.response_mask.sum(-1)
    assert bool((batch.response_ids[batch.response_mask == 0] == policy.pad_token_id).all())
    assert batch.response_ids.shape[1] == int(lengths.max())
    # A block alone, with the same seed, gives the same rows: blocks do not depend on each other.
    whole = concat_rollouts([batch], policy.pad_token_id)
    assert whole is batch
    assert select_encoded(encoded, 1, 3).token_ids[0] is encoded.token_ids[1]


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def encoded(policy):
    from grpo_zoo.data import load_questions
    from grpo_zoo.evaluation import as_prompts

    cfg = load_config(None, ["testbed.train_questions=8"])
    questions, _ = load_questions("testbed", cfg.data, cfg.testbed, "train")
    return policy.encode(as_prompts(questions[:3]))


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    ray = pytest.importorskip("ray")
    from grpo_zoo.backends.ray_workers import FAULT_DIR_ENV

    fault_dir = tmp_path_factory.mktemp("faults")
    os.environ[FAULT_DIR_ENV] = str(fault_dir)  # inherited by the raylet, hence by every worker
    ray.init(num_cpus=2, object_store_memory=80 * 2**20, include_dashboard=False, log_to_driver=False)
    try:
        yield fault_dir
    finally:
        ray.shutdown()
        del os.environ[FAULT_DIR_ENV]


def overrides(model_dir, out_dir, *extra):
    return [
        f"model.path={model_dir}",
        "testbed.train_questions=48",
        "testbed.eval_questions=8",
        "rollout.group_size=4",
        "rollout.max_new_tokens=6",
        "rollout.sampling_shards=2",
        "train.steps=2",
        "train.questions_per_step=3",
        "train.lr=1e-2",
        "train.weight_decay=0.5",  # a random model earns no reward; decay still moves the weights each update
        "eval.num_questions=4",
        "eval.samples=2",
        "eval.every=0",
        "eval.at_start=false",
        "output.tensorboard=false",
        "output.progress=false",
        "reward.num_workers=0",
        f"output.dir={out_dir}",
        *extra,
    ]


def comparable(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def final_weights(run_dir, step):
    return final_weights_of(run_dir / "checkpoints" / f"step-{step:06d}" / "policy")


def final_weights_of(model_dir):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.fixture(scope="module")
def single_process_run(tiny_model, tmp_path_factory):
    from grpo_zoo.trainer import train

    out = tmp_path_factory.mktemp("hf")
    return train(load_config(None, overrides(tiny_model, out / "run")), recipe="hf").run_dir


RAY_RUN = ["rollout.backend=ray", "distributed.ray.num_rollout_workers=2", "distributed.ray.num_reward_workers=2",
           *HALF_CPU]


# ---------------------------------------------------------------------------------- equivalence


def test_two_ray_workers_match_the_single_process_run_even_when_workers_die(
    ray_cluster, tiny_model, tmp_path, single_process_run
):
    """Same seed, same sampling_shards: every metric and the final weights are bit-identical to one process.

    A rollout worker and a reward worker are killed inside step 0's calls; Ray restarts them and the
    calls are re-sent with the same inputs and seeds, so no sample is lost or scored twice. (One
    Ray run checks both, to keep the module fast; the next test kills a worker after an update.)
    """
    from grpo_zoo.trainer import train

    for kind in ("rollout", "reward"):
        (ray_cluster / f"kill-{kind}").touch()
    result = train(load_config(None, overrides(tiny_model, tmp_path / "run", *RAY_RUN)), recipe="ray")
    fired = sorted(p.name.rsplit("-", 1)[0] for p in ray_cluster.glob("killed-*"))
    for p in ray_cluster.glob("killed-*"):
        p.unlink()
    assert fired == ["killed-reward", "killed-rollout"]
    ours, reference = comparable(result.run_dir), comparable(single_process_run)
    steps = [r for r in ours if "train/loss" in r]
    assert len(steps) == 2  # the second step samples after a weight sync
    assert steps[0]["rollout/responses"] == 3 * 4  # B x G: every sample exactly once
    assert ours == reference
    a, b = final_weights(result.run_dir, 2), final_weights(single_process_run, 2)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = final_weights_of(tiny_model)
    assert any(not torch.equal(a[k], start[k]) for k in a if k in start), "the update changed nothing"


def test_restarted_worker_loads_the_current_weights(ray_cluster, tiny_model, policy, encoded):
    """Kill after an update: the restarted worker must sample with the new weights, not the checkpoint's."""
    import copy

    from grpo_zoo.backends.ray_workers import RayRollout

    cfg = load_config(None, [f"model.path={tiny_model}", *RAY_RUN])
    trained = copy.deepcopy(policy)
    ray_rollout = RayRollout(cfg, trained, str(tiny_model))
    try:
        torch.manual_seed(1)
        ray_rollout.generate(encoded, SAMPLING, version=0)
        with torch.no_grad():  # an "update": every trainable parameter moves
            for p in trained.model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        (ray_cluster / "kill-rollout").touch()
        torch.manual_seed(2)
        got = ray_rollout.generate(encoded, SAMPLING, version=1)
        torch.manual_seed(2)
        want = HfRollout(trained, shards=2).generate(encoded, SAMPLING, version=1)
        torch.manual_seed(2)
        stale = HfRollout(policy, shards=2).generate(encoded, SAMPLING, version=1)
        assert ray_rollout.retries == 1 and list(ray_cluster.glob("killed-rollout-*"))
        assert not torch.equal(want.response_ids, stale.response_ids)  # the update changes the samples
        assert torch.equal(got.response_ids, want.response_ids) and got.response_texts == want.response_texts
        assert torch.equal(got.prompt_index, want.prompt_index) and got.policy_version == 1
        assert got.extras["prompt_token_ids"] == list(encoded.token_ids)  # restored from the driver's copy
    finally:
        ray_rollout.close()
        for p in ray_cluster.glob("kill*"):
            p.unlink()
