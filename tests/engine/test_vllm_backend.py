"""The vllm rollout backend: CPU tests of its conversions and checks, GPU tests where vLLM is installed.

vLLM is optional and GPU-only, so everything that needs the engine is marked `gpu` and skips
cleanly without it; the rest (lazy import, pixel limits, output conversion, LoRA merge) runs on CPU.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from grpo_zoo.backends.rollout import Sampling
from grpo_zoo.backends.vllm_rollout import merged_state, outputs_to_rollout, processor_pixel_limits, vllm_available
from grpo_zoo.config import LoraConfig, load_config
from grpo_zoo.configuration import ConfigError
from grpo_zoo.run import check_backends

SAMPLING = Sampling(group_size=2, temperature=1.0, top_p=1.0, max_new_tokens=4)
HAS_VLLM_GPU = vllm_available() and torch.cuda.is_available()


@pytest.fixture(scope="module")
def encoded(policy):
    from grpo_zoo.data import load_questions
    from grpo_zoo.evaluation import as_prompts

    cfg = load_config(None, ["testbed.train_questions=8"])
    questions, _ = load_questions("testbed", cfg.data, cfg.testbed, "train")
    return policy.encode(as_prompts(questions[:2]))


def test_module_never_imports_vllm():
    # This module and grpo_zoo.run are imported above; only building the backend may import vllm.
    assert "vllm" not in sys.modules


@pytest.mark.skipif(HAS_VLLM_GPU, reason="vLLM and a GPU are both here")
def test_vllm_without_vllm_or_gpu_is_a_config_error():
    with pytest.raises(ConfigError, match=r"grpo_zoo\[vllm\]|GPU"):
        check_backends(load_config(None, ["rollout.backend=vllm"]))


def test_engine_gets_the_training_processors_pixel_limits(policy):
    # The tiny model's processor fixes min = max = 112 x 112; vLLM must resize identically.
    assert processor_pixel_limits(policy.processor) == {"min_pixels": 112 * 112, "max_pixels": 112 * 112}
    assert processor_pixel_limits(policy.tokenizer) == {}  # text-only: nothing to pass
    legacy = SimpleNamespace(image_processor=SimpleNamespace(min_pixels=3136, max_pixels=12544, size=None))
    assert processor_pixel_limits(legacy) == {"min_pixels": 3136, "max_pixels": 12544}


def _completion(index, ids, logp):
    return SimpleNamespace(index=index, token_ids=ids, logprobs=[{t: SimpleNamespace(logprob=logp)} for t in ids])


def test_outputs_become_a_rollout_batch_like_hf(policy, encoded):
    eos = policy.eos_token_ids[0]
    image = policy.model.config.image_token_id
    outputs = [
        SimpleNamespace(
            prompt_token_ids=encoded.token_ids[b].tolist(),
            # completions arrive out of order; the second prompt's first one ends at EOS
            outputs=[_completion(1, [5, 6, 7], -0.5), _completion(0, [8, eos], -0.25)] if b == 0 else
            [_completion(0, [9, eos, 11], -1.0), _completion(1, [12], -2.0)],
        )
        for b in range(2)
    ]
    batch = outputs_to_rollout(outputs, encoded, policy, SAMPLING, image)
    assert batch.prompt_index.tolist() == [0, 0, 1, 1]
    assert batch.response_ids[:, :2].tolist() == [[8, eos], [5, 6], [9, eos], [12, policy.pad_token_id]]
    assert batch.response_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]]  # EOS kept, then cut
    assert batch.sampler_logprobs.tolist() == [[-0.25, -0.25, 0], [-0.5] * 3, [-1.0, -1.0, 0], [-2.0, 0, 0]]
    assert batch.extras["prompt_token_ids"] == list(encoded.token_ids)
    assert len(batch.response_texts) == 4

    outputs[1].prompt_token_ids = [t for t in outputs[1].prompt_token_ids if t != image]  # vLLM resized differently
    with pytest.raises(ValueError, match="image tokens"):
        outputs_to_rollout(outputs, encoded, policy, SAMPLING, image)


def test_lora_weights_are_merged_under_hugging_face_names(tiny_model, policy):
    from grpo_zoo.policy import Policy

    lora = Policy.from_pretrained(str(tiny_model), lora=LoraConfig(enabled=True, r=2, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, p in lora.model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)  # B starts at zero: make the adapter do something
    state = merged_state(lora)
    base = policy.model.state_dict()
    assert state.keys() == base.keys()
    q = next(k for k in state if k.endswith("q_proj.weight"))
    assert not torch.equal(state[q], base[q])
    k = next(k for k in state if k.endswith("k_proj.weight"))
    assert torch.equal(state[k], base[k])
    live = {n.replace("base_model.model.", "").replace(".base_layer", ""): p.detach()
            for n, p in lora.model.named_parameters() if "lora_" not in n}
    assert torch.equal(live[q], base[q])  # the adapter was unmerged again: training goes on from W, not W + BA


class FakeLLM:
    """Stands in for vllm.LLM: records the engine arguments and the calls the backend makes."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list[tuple] = []
        self.requests: list[dict] = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self):
        self.calls.append(("wake",))

    def apply_model(self, fn):
        return [fn(SimpleNamespace(load_weights=lambda items: self.calls.append(("load", len(list(items))))))]

    def generate(self, requests, params, use_tqdm=False):
        self.calls.append(("generate", len(requests)))
        self.requests = requests
        eos = params[0].stop_token_ids[0]
        return [SimpleNamespace(prompt_token_ids=None, outputs=[
            SimpleNamespace(index=i, token_ids=[5, eos], logprobs=[{5: -1.0}, {eos: -0.5}]) for i in range(p.n)])
            for p in params]


@pytest.fixture
def fake_vllm(monkeypatch):
    import dataclasses
    import types

    @dataclasses.dataclass
    class EngineArgs:
        logprobs_mode: str = "raw_logprobs"
        generation_config: str = "auto"

    modules = {name: types.ModuleType(name) for name in ("vllm", "vllm.engine", "vllm.engine.arg_utils")}
    modules["vllm"].LLM = FakeLLM
    modules["vllm"].SamplingParams = lambda **kw: SimpleNamespace(**kw)
    modules["vllm.engine.arg_utils"].EngineArgs = EngineArgs
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.mark.parametrize("level", [1, 2])
def test_engine_sleeps_between_rollouts_and_syncs_once_per_version(fake_vllm, tiny_model, policy, encoded, level):
    from grpo_zoo.backends.vllm_rollout import VllmRollout

    cfg = load_config(None, [f"model.path={tiny_model}", f"rollout.vllm.sleep_level={level}"])
    backend = VllmRollout(cfg, policy, str(tiny_model))
    llm = backend.llm
    assert llm.kwargs["mm_processor_kwargs"] == {"min_pixels": 112 * 112, "max_pixels": 112 * 112}
    assert llm.kwargs["enable_sleep_mode"] and llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert llm.kwargs["generation_config"] == "vllm"  # the checkpoint's sampling defaults are ignored
    assert llm.calls == [("sleep", level)]  # asleep until the first rollout: training has the memory
    llm.calls.clear()
    n_weights = len(policy.model.state_dict())
    for version in (0, 0, 1):
        batch = backend.generate(encoded, SAMPLING, version=version)
        assert batch.policy_version == version and batch.num_responses == 2 * len(encoded)
    load = [("load", n_weights)]
    # Level 1 keeps the synced weights (in CPU RAM) across a sleep; level 2 drops them, so every wake reloads.
    second = load if level == 2 else []
    assert llm.calls == [("wake",), *load, ("generate", 2), ("sleep", level),
                         ("wake",), *second, ("generate", 2), ("sleep", level),
                         ("wake",), *load, ("generate", 2), ("sleep", level)]
    assert all("multi_modal_data" in r for r, p in zip(llm.requests, encoded.prompts) if p.images)
    assert batch.sampler_logprobs[0].tolist() == [-1.0, -0.5]


# ---------------------------------------------------------------------------------- GPU + vLLM


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_VLLM_GPU, reason="needs vllm (the [vllm] extra) and a CUDA GPU")
def test_vllm_rollout_samples_syncs_weights_and_reports_logprobs(tiny_model, encoded):
    from grpo_zoo.backends.vllm_rollout import VllmRollout
    from grpo_zoo.policy import Policy

    cfg = load_config(None, [f"model.path={tiny_model}", "rollout.backend=vllm", "rollout.vllm.enforce_eager=true",
                             "rollout.vllm.gpu_memory_utilization=0.2"])
    policy = Policy.from_pretrained(str(tiny_model), device="cuda")
    gpu_encoded = policy.encode(encoded.prompts)
    backend = VllmRollout(cfg, policy, str(tiny_model))
    try:
        sampling = Sampling(group_size=4, temperature=1.0, top_p=1.0, max_new_tokens=8)
        batch = backend.generate(gpu_encoded, sampling, version=0)
        assert batch.num_responses == 4 * len(encoded) and batch.policy_version == 0
        logp, _ = policy.logprobs(batch, torch.arange(batch.num_responses))
        mask = batch.response_mask.to(logp.device)
        gap = ((logp - batch.sampler_logprobs.to(logp.device)).abs() * mask).max()
        assert gap < 1e-2, f"vLLM's log-probs differ from the trainer's by {gap}"
        with torch.no_grad():
            for p in policy.model.parameters():
                p.mul_(0.0)  # an all-zero model samples uniformly: the synced engine must see it
        batch = backend.generate(gpu_encoded, sampling, version=1)
        uniform = -torch.log(torch.tensor(float(policy.model.config.get_text_config().vocab_size)))
        assert backend.version == 1 and float(batch.sampler_logprobs[0, 0]) == pytest.approx(float(uniform), abs=0.5)
    finally:
        backend.close()
