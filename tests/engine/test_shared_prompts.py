"""Prefix sharing (grpo_zoo/shared_prompts.py) computes what the plain path computes, only once per prompt.

Each check runs the same call with `prefix_sharing` on and off: sampled and greedy tokens must be
identical to HF generate's under the same seed, and log-probs, entropies and every parameter's
gradient equal to a full prompt + response forward per row.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.modeling_layers import GradientCheckpointingLayer

from grpo_zoo import shared_prompts
from grpo_zoo.policy import Policy
from grpo_zoo.types import Prompt


def _image(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (112, 112, 3), dtype=np.uint8))


def _prompts(with_images: bool = True) -> list[Prompt]:
    """Prompts of different lengths (left padding), with and without an image in one batch."""
    pictures = [[_image(i)] if with_images and i != 2 else [] for i in range(4)]
    texts = ["<image>How many shapes?", "Count: <image> and add 2, then write a much longer question than the others.",
             "No image at all?", "<image>{braces} \\boxed{}"]
    return [Prompt(i, t if pictures[i] else t.replace("<image>", ""), str(i), pictures[i]) for i, t in enumerate(texts)]


@pytest.fixture(scope="module")
def text_policy(tmp_path_factory) -> Policy:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_zoo.testbed.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(0)
    model_dir = tmp_path_factory.mktemp("text") / "model"
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return Policy.from_pretrained(str(model_dir))


def _cases(policy: Policy, text_policy: Policy):
    return [(policy, _prompts(with_images=True)), (text_policy, _prompts(with_images=False))]


def _generate(policy: Policy, prompts: list[Prompt], share: bool, **kwargs):
    policy.prefix_sharing = share
    try:
        torch.manual_seed(11)
        return policy.generate(policy.encode(prompts), group_size=3, max_new_tokens=20, **kwargs)
    finally:
        policy.prefix_sharing = True


@pytest.mark.parametrize("settings", [dict(temperature=1.0, top_p=1.0), dict(temperature=0.7, top_p=0.8),
                                      dict(temperature=1.0, top_p=1.0, greedy=True)])
def test_sampling_draws_the_tokens_hf_generate_draws(policy, text_policy, settings):
    for model, prompts in _cases(policy, text_policy):
        shared, plain = (_generate(model, prompts, share, **settings) for share in (True, False))
        assert torch.equal(shared.response_ids, plain.response_ids)
        assert torch.equal(shared.response_mask, plain.response_mask)
        assert shared.response_texts == plain.response_texts


def _logprobs_and_grads(policy: Policy, rollout, rows: torch.Tensor, share: bool):
    policy.prefix_sharing = share
    policy.model.zero_grad(set_to_none=True)
    try:
        logp, entropy = policy.logprobs(rollout, rows, with_entropy=True)
        (logp.sum() + 0.1 * entropy.sum()).backward()
        grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
        return logp.detach(), entropy.detach(), grads
    finally:
        policy.model.zero_grad(set_to_none=True)
        policy.prefix_sharing = True


def test_logprobs_entropy_and_gradients_equal_a_full_forward_per_row(policy, text_policy):
    rows = torch.tensor([4, 0, 1, 11, 6, 7, 2, 10])  # any order, prompts repeated, one prompt missing
    for model, prompts in _cases(policy, text_policy):
        rollout = _generate(model, prompts, share=True, temperature=1.0, top_p=1.0)
        shared, plain = (_logprobs_and_grads(model, rollout, rows, share) for share in (True, False))
        torch.testing.assert_close(shared[0], plain[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(shared[1], plain[1], atol=1e-5, rtol=0)
        assert shared[2].keys() == plain[2].keys() and len(plain[2]) > 0
        for name, grad in plain[2].items():  # summation order differs: compare each gradient as a whole
            error = float((shared[2][name] - grad).norm())
            assert error <= 1e-4 * float(grad.norm()) + 1e-7, (name, error, float(grad.norm()))
    _, _, vlm_grads = _logprobs_and_grads(policy, _generate(policy, _prompts(), True, temperature=1.0, top_p=1.0),
                                          rows, True)
    assert vlm_grads["model.visual.patch_embed.proj.weight"].abs().sum() > 0  # through the one image encoding


def test_one_row_per_prompt_or_gradient_checkpointing_take_the_plain_path(policy, monkeypatch):
    rollout = _generate(policy, _prompts(), share=True, temperature=1.0, top_p=1.0)
    calls = []
    original = shared_prompts.response_logits
    monkeypatch.setattr("grpo_zoo.policy.response_logits", lambda *a, **k: calls.append(1) or original(*a, **k))
    with torch.no_grad():
        policy.logprobs(rollout, torch.tensor([0, 3, 6, 9]))  # one row of each prompt: nothing to share
        assert calls == []
        policy.logprobs(rollout, torch.tensor([0, 1, 6]))
        assert calls == [1]
    policy.model.gradient_checkpointing_enable()
    try:
        policy.model.train()
        logp, _ = policy.logprobs(rollout, torch.tensor([0, 1, 2]))  # the cache is off under checkpointing
        assert calls == [1] and torch.isfinite(logp).all()
    finally:
        policy.model.gradient_checkpointing_disable()
        policy.model.eval()


def test_top_p_keeps_the_smallest_set_reaching_p_and_always_the_best_token():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.97, 0.01, 0.01, 0.01]]))
    torch.manual_seed(0)
    draws = torch.stack([shared_prompts.next_token(logits, torch.tensor([], dtype=torch.long), 1.0, 0.75, False)
                         for _ in range(400)])
    assert set(draws[:, 0].tolist()) == {0, 1} and set(draws[:, 1].tolist()) == {0}
    suppressed = shared_prompts.next_token(logits, torch.tensor([0]), 1.0, 1.0, greedy=True)
    assert suppressed.tolist() == [1, 1]


@contextmanager
def counting_recomputations(policy: Policy) -> Iterator[tuple[list[int], int]]:
    """Gradient checkpointing on, each checkpointed layer's recomputation counted: (calls, number of layers)."""
    policy.model.gradient_checkpointing_enable()
    calls: list[int] = []
    layers = [m for m in policy.model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        func = layer._gradient_checkpointing_func
        layer._gradient_checkpointing_func = lambda *a, _f=func, **k: calls.append(1) or _f(*a, **k)
    try:
        yield calls, len(layers)
    finally:
        for layer in layers:
            del layer._gradient_checkpointing_func
        policy.model.gradient_checkpointing_disable()


def test_gradient_checkpointing_recomputes_in_the_update_and_keeps_the_gradient(policy):
    """HF checkpoints a layer only in training mode; the policy stays in eval mode, so the update turns it on."""
    rollout = _generate(policy, _prompts(), share=True, temperature=1.0, top_p=1.0)
    rows = torch.tensor([0, 1, 2, 6, 7])
    _, _, plain = _logprobs_and_grads(policy, rollout, rows, share=False)
    with counting_recomputations(policy) as (calls, layers):
        with torch.no_grad():
            policy.logprobs(rollout, rows)  # no backward follows: nothing to recompute
        assert calls == []
        _, _, checkpointed = _logprobs_and_grads(policy, rollout, rows, share=True)
        assert len(calls) == layers == 6  # 4 decoder + 2 vision blocks (sharing stepped aside)
        assert not policy.model.training and not any(m.training for m in policy.model.modules())
        for name, grad in plain.items():
            assert float((checkpointed[name] - grad).norm()) <= 1e-5 * float(grad.norm()) + 1e-7, name


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_prefix_sharing_and_checkpointing_keep_logprobs_and_gradients_on_cuda(tiny_model):
    torch.backends.cudnn.allow_tf32 = False  # the patch embedding is a convolution: keep it in full float32
    policy = Policy.from_pretrained(str(tiny_model), device="cuda")
    assert next(policy.model.parameters()).is_cuda
    rollout = _generate(policy, _prompts(), share=True, temperature=1.0, top_p=1.0)
    assert rollout.response_ids.shape[0] == 12
    rows = torch.tensor([4, 0, 1, 11, 6, 7, 2, 10])
    shared, plain = (_logprobs_and_grads(policy, rollout, rows, share) for share in (True, False))
    torch.testing.assert_close(shared[0], plain[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(shared[1], plain[1], atol=1e-4, rtol=0)
    assert shared[2].keys() == plain[2].keys() and len(plain[2]) > 0
    for name, grad in plain[2].items():
        assert float((shared[2][name] - grad).norm()) <= 1e-3 * float(grad.norm()) + 1e-6, name
    with counting_recomputations(policy) as (calls, layers):
        _, _, checkpointed = _logprobs_and_grads(policy, rollout, rows, share=True)
        assert len(calls) == layers > 0
        for name, grad in plain[2].items():
            assert float((checkpointed[name] - grad).norm()) <= 1e-3 * float(grad.norm()) + 1e-6, name


@pytest.mark.gpu
@needs_cuda
def test_greedy_decoding_with_and_without_sharing_agree_on_cuda(tiny_model):
    policy = Policy.from_pretrained(str(tiny_model), device="cuda")
    outputs = [_generate(policy, _prompts(), share, temperature=1.0, top_p=1.0, greedy=True) for share in (True, False)]
    # Different kernels for different shapes may round differently; a random model's near-ties can then
    # flip a token, so demand agreement on nearly all rows rather than all.
    same = [torch.equal(a, b) for a, b in zip(outputs[0].response_ids, outputs[1].response_ids)]
    assert sum(same) >= len(same) - 1, same
