"""The `hf` policy on the tiny random Qwen2.5-VL: encode, generate, log-probs, save, LoRA, hf_compat."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoProcessor, GenerationConfig
from transformers.utils import is_torchvision_available

import grpo_zoo.hf_compat as hf_compat
from grpo_zoo.config import LoraConfig
from grpo_zoo.policy import Policy, response_mask_from_eos, vision_patch_features
from grpo_zoo.testbed.tiny_model import build_tiny_vlm
from grpo_zoo.types import Prompt


def _image(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (112, 112, 3), dtype=np.uint8))


def _prompts() -> list[Prompt]:
    return [
        Prompt(0, "<image>How many shapes?", "3", [_image(0)]),
        Prompt(1, "Count: <image> and add 2, then write a longer question.", "5", [_image(1)]),
        Prompt(2, "No image at all?", "1", []),
        Prompt(3, "<image>{braces} \\boxed{}", "2", [_image(2)]),
    ]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("policy") / "model", seed=0)


@pytest.fixture(scope="module")
def policy(tiny_dir) -> Policy:
    return Policy.from_pretrained(str(tiny_dir))


@pytest.fixture(scope="module")
def rollout(policy):
    torch.manual_seed(0)
    return policy.generate(policy.encode(_prompts()), group_size=3, temperature=1.0, top_p=1.0, max_new_tokens=24)


def test_encode_left_pads_and_expands_images(policy):
    enc = policy.encode(_prompts(), system_prompt="Be brief.")
    assert enc.input_ids.shape == enc.attention_mask.shape and enc.input_ids.shape[0] == 4
    image_id = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for b, ids in enumerate(enc.token_ids):
        length = len(ids)
        assert enc.attention_mask[b].sum() == length and enc.attention_mask[b, -length:].all()  # left padding
        assert torch.equal(enc.input_ids[b, -length:], ids)
        assert int((ids == image_id).sum()) == 16 * len(enc.prompts[b].images)  # 112 px -> 16 tokens
        assert enc.texts[b].startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    assert "\\boxed{}" in enc.texts[3] and "{braces}" in enc.texts[3]  # the template is not str.format
    assert enc.texts[1].index("Count: ") < enc.texts[1].index("<|vision_start|>")  # tag position kept
    assert enc.model_inputs[0]["pixel_values"].shape[0] == 64 and "pixel_values" not in enc.model_inputs[2]


def test_encode_rejects_bad_prompts(policy):
    with pytest.raises(ValueError, match="tag"):
        policy.encode([Prompt(0, "<image><image>two?", "1", [_image(0)])])
    with pytest.raises(ValueError, match="problem"):
        policy.encode(_prompts(), template="no placeholder")
    with pytest.raises(ValueError, match="empty"):
        policy.encode([])


def test_generate_shapes_masks_and_texts(policy, rollout):
    n = 4 * 3
    assert rollout.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert rollout.response_ids.shape == rollout.response_mask.shape and rollout.response_ids.shape[0] == n
    mask = rollout.response_mask
    lengths = mask.sum(-1).long()
    assert mask.shape[1] == int(lengths.max()) <= 24
    eos = torch.tensor(policy.eos_token_ids)
    for i in range(n):
        length = int(lengths[i])
        assert mask[i, :length].all() and not mask[i, length:].any()  # contiguous from the start
        ids = rollout.response_ids[i, :length]
        eos_hits = torch.isin(ids, eos).nonzero().flatten().tolist()
        assert eos_hits in ([], [length - 1])  # stops at (and keeps) its first EOS
        if not eos_hits:
            assert length == 24  # only a row cut at max_new_tokens has no EOS
        assert (rollout.response_ids[i, length:] == policy.pad_token_id).all()
        assert rollout.response_texts[i] == policy.tokenizer.decode(ids.tolist(), skip_special_tokens=True)


def test_generate_is_reproducible_under_the_global_seed(policy):
    enc = policy.encode(_prompts()[:2])
    outs = []
    for _ in range(2):
        torch.manual_seed(123)
        outs.append(policy.generate(enc, group_size=2, temperature=1.0, top_p=0.9, max_new_tokens=12).response_ids)
    assert torch.equal(outs[0], outs[1])
    greedy = policy.generate(enc, group_size=2, temperature=1.0, top_p=1.0, max_new_tokens=12, greedy=True)
    assert torch.equal(greedy.response_ids[0], greedy.response_ids[1])


def test_vision_special_tokens_are_never_sampled(policy):
    # A random model at temperature 2 spreads mass over every id: ~3,000 draws would hit the 5
    # vision ids (~2% of 266) dozens of times if they were not suppressed.
    enc = policy.encode([p for p in _prompts() if p.images] * 2)
    torch.manual_seed(0)
    out = policy.generate(enc, group_size=8, temperature=2.0, top_p=1.0, max_new_tokens=64)
    sampled = out.response_ids[out.response_mask.bool()]
    assert sampled.numel() > 1500
    assert not torch.isin(sampled, torch.tensor(policy.suppressed_token_ids)).any()
    vision_ids = [policy.tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|vision_start|>")]
    assert set(vision_ids) <= set(policy.suppressed_token_ids)
    with torch.no_grad():
        policy.logprobs(out, torch.arange(out.num_responses))  # the next forward still works


def _reference_logprobs(policy: Policy, rollout, row: int) -> torch.Tensor:
    """log-softmax of one unpadded full forward of prompt + response, straight through the model."""
    b = int(rollout.prompt_index[row])
    length = int(rollout.response_mask[row].sum())
    prompt_ids = rollout.extras["prompt_token_ids"][b]
    inputs = dict(rollout.extras["prompt_model_inputs"][b])
    ids = torch.cat([prompt_ids, rollout.response_ids[row, :length]])[None]
    inputs["mm_token_type_ids"] = torch.nn.functional.pad(inputs["mm_token_type_ids"], (0, length))[None]
    with torch.no_grad():
        logits = policy.model(input_ids=ids, attention_mask=torch.ones_like(ids), **inputs).logits[0]
    logp = torch.log_softmax(logits[len(prompt_ids) - 1 : -1].float(), dim=-1)
    return logp.gather(-1, rollout.response_ids[row, :length, None]).squeeze(-1)


def test_logprobs_equal_a_separate_full_forward(policy, rollout):
    with torch.no_grad():
        logp, entropy = policy.logprobs(rollout, torch.arange(rollout.num_responses), with_entropy=True)
    assert logp.shape == entropy.shape == rollout.response_mask.shape
    assert (logp[rollout.response_mask == 0] == 0).all() and (entropy >= 0).all()
    for row in range(rollout.num_responses):
        length = int(rollout.response_mask[row].sum())
        torch.testing.assert_close(logp[row, :length], _reference_logprobs(policy, rollout, row), atol=1e-5, rtol=0)


def test_logprobs_equal_the_samplers_kv_cache_logits(policy):
    # The decode path (KV cache, rope deltas) and the training forward must agree on positions.
    enc = policy.encode(_prompts())
    torch.manual_seed(7)
    out = policy.generate(enc, group_size=2, temperature=1.0, top_p=1.0, max_new_tokens=16)
    batch = policy._batch(enc.token_ids, enc.model_inputs, out.prompt_index.tolist())
    config = GenerationConfig(do_sample=True, top_k=0, max_new_tokens=16, eos_token_id=policy.eos_token_ids,
                              pad_token_id=policy.pad_token_id, suppress_tokens=policy.suppressed_token_ids,
                              output_logits=True, return_dict_in_generate=True)
    torch.manual_seed(7)
    gen = policy.model.generate(**batch, generation_config=config)
    width = out.response_ids.shape[1]
    sampler = torch.log_softmax(torch.stack(gen.logits, 1)[:, :width].float(), -1)
    sampler = sampler.gather(-1, out.response_ids[..., None]).squeeze(-1) * out.response_mask
    with torch.no_grad():
        logp, _ = policy.logprobs(out, torch.arange(out.num_responses))
    torch.testing.assert_close(logp, sampler, atol=1e-5, rtol=0)


def test_logprobs_of_any_subset_equal_the_full_batch(policy, rollout):
    all_rows = torch.arange(rollout.num_responses)
    with torch.no_grad():
        full, full_ent = policy.logprobs(rollout, all_rows, with_entropy=True)
        for rows in (torch.tensor([7]), torch.tensor([11, 0, 6]), all_rows.flip(0), torch.tensor([1, 2])):
            sub, sub_ent = policy.logprobs(rollout, rows, with_entropy=True)
            torch.testing.assert_close(sub, full[rows], atol=1e-5, rtol=0)
            torch.testing.assert_close(sub_ent, full_ent[rows], atol=1e-5, rtol=0)
        keep = torch.zeros(rollout.num_responses, dtype=torch.bool)
        keep[[2, 5]] = True
        torch.testing.assert_close(policy.logprobs(rollout, keep)[0], full[keep], atol=1e-5, rtol=0)
        empty, _ = policy.logprobs(rollout, torch.tensor([], dtype=torch.long))
        assert empty.shape == (0, rollout.response_ids.shape[1])


def test_logprobs_backpropagate_into_language_model_and_vision_tower(policy, rollout):
    policy.model.zero_grad(set_to_none=True)
    logp, _ = policy.logprobs(rollout, torch.tensor([0, 1, 4]))
    (-(logp.sum())).backward()
    grads = {name: p.grad for name, p in policy.model.named_parameters()}
    assert grads["model.visual.patch_embed.proj.weight"].abs().sum() > 0
    assert grads["model.language_model.layers.0.self_attn.q_proj.weight"].abs().sum() > 0
    policy.model.zero_grad(set_to_none=True)


def test_logprobs_need_the_prompt_extras(policy, rollout):
    broken = type(rollout)(**{**rollout.__dict__, "extras": {}})
    with pytest.raises(ValueError, match="prompt_token_ids"):
        policy.logprobs(broken, torch.tensor([0]))


def test_save_and_reload_give_identical_logprobs(policy, rollout, tmp_path):
    policy.save(tmp_path / "saved")
    again = Policy.from_pretrained(str(tmp_path / "saved"))
    with torch.no_grad():
        rows = torch.arange(rollout.num_responses)
        assert torch.equal(policy.logprobs(rollout, rows)[0], again.logprobs(rollout, rows)[0])


def test_lora_trains_adapters_only_and_saves_merged(tiny_dir, rollout, tmp_path):
    lora = Policy.from_pretrained(str(tiny_dir), lora=LoraConfig(enabled=True, r=4, alpha=8))
    trainable = {n for n, p in lora.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert len(lora.parameters_for_training()) == len(trainable)
    for p in lora.parameters_for_training():  # make the adapters non-zero so merging matters
        torch.nn.init.normal_(p, std=0.05)
    rows = torch.arange(rollout.num_responses)
    with torch.no_grad():
        before = lora.logprobs(rollout, rows)[0]
    lora.save(tmp_path / "merged")
    merged = Policy.from_pretrained(str(tmp_path / "merged"))
    with torch.no_grad():
        torch.testing.assert_close(merged.logprobs(rollout, rows)[0], before, atol=1e-5, rtol=0)
        torch.testing.assert_close(lora.logprobs(rollout, rows)[0], before, atol=0, rtol=0)  # live adapters kept


def test_vision_patch_features_per_image(policy):
    wide = _image(1).resize((224, 112))  # resized to ~12544 pixels keeping the aspect: 14 x 7 patches -> 10 tokens
    feats = vision_patch_features(policy, [_image(0), wide, _image(0)])
    assert [tuple(f.shape) for f in feats] == [(16, 128), (10, 128), (16, 128)]
    assert torch.isfinite(feats[0]).all() and torch.allclose(feats[0], feats[2], atol=1e-6)


def test_response_mask_from_eos():
    ids = torch.tensor([[5, 9, 7, 9, 1], [5, 5, 5, 5, 5], [9, 1, 1, 1, 1]])
    assert response_mask_from_eos(ids, [9]).tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]


def test_from_pretrained_refuses_non_local_paths(tmp_path):
    with pytest.raises(ValueError, match="never downloads"):
        Policy.from_pretrained("Qwen/Qwen2.5-VL-7B-Instruct")
    with pytest.raises(ValueError, match="dtype"):
        Policy.from_pretrained(str(tmp_path), dtype="float64")


@pytest.mark.skipif(is_torchvision_available(), reason="with torchvision, transformers' own classes are used")
def test_auto_processor_loads_a_qwen_checkpoint_layout_without_torchvision(tiny_dir, tmp_path):
    # A real Qwen2.5-VL checkpoint names its processor in preprocessor_config.json and has no
    # processor_config.json; AutoProcessor must still return image processor + tokenizer.
    ckpt = tmp_path / "qwen_layout"
    shutil.copytree(tiny_dir, ckpt)
    (ckpt / "processor_config.json").unlink()
    (ckpt / "preprocessor_config.json").write_text(json.dumps({
        "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
    }))
    importlib.reload(hf_compat)  # registration is idempotent
    processor = AutoProcessor.from_pretrained(ckpt)
    assert hf_compat.is_image_only(processor) and processor.image_processor is not None
    assert processor.image_processor.size.longest_edge == 12845056
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}]}], tokenize=False)
    out = processor(text=[text], images=[_image(0)], return_tensors="pt")
    assert int((out["input_ids"] == processor.image_token_id).sum()) == 16


def test_load_processor_falls_back_to_image_only_when_transformers_wants_a_video_processor(tiny_dir, monkeypatch):
    # With torchvision installed, AutoProcessor builds the library class, which demands a video
    # processor config that the testbed's (image-only) directory never had.
    def wants_video(path, **kwargs):
        raise OSError(f"Can't load video processor for '{path}'. ... video_preprocessor_config.json file")

    monkeypatch.setattr(hf_compat.AutoProcessor, "from_pretrained", wants_video)
    processor = hf_compat.load_processor(str(tiny_dir))
    assert hf_compat.is_image_only(processor) and processor.image_processor is not None
    monkeypatch.setattr(hf_compat.AutoProcessor, "from_pretrained",
                        lambda path, **kwargs: (_ for _ in ()).throw(OSError("disk on fire")))
    with pytest.raises(OSError, match="disk on fire"):  # any other error is the user's to see
        hf_compat.load_processor(str(tiny_dir))


def test_frozen_vision_tower_gets_no_gradient_and_the_language_model_still_trains(tiny_dir, rollout):
    frozen = Policy.from_pretrained(str(tiny_dir), freeze_vision_tower=True)
    trainable = dict(frozen.model.named_parameters())
    visual = [n for n in trainable if ".visual." in f".{n}"]
    assert visual and not any(trainable[n].requires_grad for n in visual)
    assert all(p.requires_grad for n, p in trainable.items() if n not in visual)
    assert {id(p) for p in frozen.parameters_for_training()}.isdisjoint(id(trainable[n]) for n in visual)
    logp, _ = frozen.logprobs(rollout, torch.arange(2))
    (logp * rollout.response_mask[:2]).sum().backward()
    assert all(trainable[n].grad is None for n in visual)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in frozen.parameters_for_training())
    assert frozen.freeze_vision() == 0  # idempotent: nothing left to freeze
