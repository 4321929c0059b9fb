"""The testbed's tokenizer, tiny VLM and cached warm-up (all offline, a few seconds)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

import grpo_zoo.hf_compat  # noqa: F401
from grpo_zoo.config import TestbedConfig as BedConfig  # "Test*" names confuse pytest collection
from grpo_zoo.testbed.tiny_model import TinyVLMSpec, build_tiny_vlm, count_parameters
from grpo_zoo.testbed.tokenizer import SPECIAL_TOKENS, build_tokenizer

TRICKY = "a  b\n\n{x}\\boxed{12} \\\\ }{ \t tab  <think>1+2=3.</think> end \n"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_tokenizer_round_trips_after_save_and_reload(tmp_path):
    tok = build_tokenizer()
    tok.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    printable = "".join(chr(c) for c in range(32, 127)) + "\n"
    samples = [TRICKY, printable, printable[::-1], "", " ", "\n", "héllo 中"]
    rng = random.Random(0)
    samples += ["".join(rng.choice(printable) for _ in range(200)) for _ in range(20)]
    for text in samples:
        ids = reloaded(text, add_special_tokens=False)["input_ids"]
        assert reloaded.decode(ids) == text
        assert ids == tok(text, add_special_tokens=False)["input_ids"]
    # one token per character of the task alphabet; special tokens are single ids
    assert len(reloaded(printable, add_special_tokens=False)["input_ids"]) == len(printable)
    for special in (*SPECIAL_TOKENS, "<think>", "</think>"):
        assert len(reloaded(special, add_special_tokens=False)["input_ids"]) == 1
    assert reloaded.decode(reloaded("<|im_start|>hi<|im_end|>")["input_ids"], skip_special_tokens=True) == "hi"


def test_chat_template_is_short_and_places_the_image():
    tok = build_tokenizer()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many?<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
                                    tokenize=False, add_generation_prompt=False)
    assert plain == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"


def test_tiny_vlm_sizes_and_processor(tiny_dir):
    model = AutoModelForImageTextToText.from_pretrained(tiny_dir)
    counts = count_parameters(model)
    assert 0.9e6 < counts["text"] < 1.2e6 and 0.6e6 < counts["vision"] < 1.0e6
    processor = AutoProcessor.from_pretrained(tiny_dir)
    assert processor.image_processor is not None and processor.chat_template
    out = processor.image_processor(images=[Image.new("RGB", (112, 112), (200, 10, 10))], return_tensors="pt")
    assert out["pixel_values"].shape[0] == 64  # 8 x 8 patches of 14 px
    assert out["image_grid_thw"].tolist() == [[1, 8, 8]]  # -> 16 image tokens after the 2 x 2 merge


def test_same_seed_gives_bit_identical_weights_and_logits(tiny_dir, tmp_path):
    again = build_tiny_vlm(tmp_path / "again", seed=0)
    other = build_tiny_vlm(tmp_path / "other", seed=1)
    a, b, c = (load_file(str(d / "model.safetensors")) for d in (tiny_dir, again, other))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    logits = [AutoModelForImageTextToText.from_pretrained(d)(input_ids=ids).logits for d in (tiny_dir, again)]
    assert torch.equal(logits[0], logits[1])


def test_spec_rejects_bad_mrope_section():
    with pytest.raises(ValueError, match="mrope_section"):
        TinyVLMSpec(mrope_section=(4, 4, 4))


# ------------------------------------------------------------------------------ warm-up


def _tiny_warmup_cfg(tmp_path: Path, **kw) -> BedConfig:
    base = dict(train_questions=24, warmup_steps=2, warmup_batch_size=4, vision_pretrain_steps=2,
                vision_pretrain_batch_size=4, cache_dir=str(tmp_path / "cache"))
    base.update(kw)
    return BedConfig(**base)


def test_warmup_runs_then_hits_the_cache(tmp_path):
    from grpo_zoo.policy import Policy
    from grpo_zoo.testbed.warmup import DONE_FILE, ensure_testbed_model

    lines: list[str] = []
    cfg = _tiny_warmup_cfg(tmp_path)
    first = ensure_testbed_model(cfg, log=lines.append)
    assert (first / DONE_FILE).is_file() and any("warm-up: step 2/2" in line for line in lines)
    assert any("vision pre-training: step 2/2" in line for line in lines)
    lines.clear()
    second = ensure_testbed_model(cfg, log=lines.append)
    assert second == first and any("cached" in line for line in lines) and not any("step" in line for line in lines)
    leftovers = [p.name for p in Path(cfg.cache_dir).iterdir() if p.name.startswith(".")]
    assert leftovers == []  # the temp dir was renamed or removed
    Policy.from_pretrained(str(first))  # loads


def test_cache_key_covers_settings_but_not_cache_dir(tmp_path):
    from grpo_zoo.testbed.warmup import cache_key

    cfg = _tiny_warmup_cfg(tmp_path)
    assert cache_key(cfg) == cache_key(_tiny_warmup_cfg(tmp_path, cache_dir="/elsewhere"))
    assert cache_key(cfg) != cache_key(_tiny_warmup_cfg(tmp_path, warmup_lr=5e-4))
    assert cache_key(cfg) != cache_key(_tiny_warmup_cfg(tmp_path, seed=1))
    assert cache_key(cfg) != cache_key(_tiny_warmup_cfg(tmp_path, vision_pretrain_steps=3))


def test_warmup_mixes_original_paraphrased_and_hinted_prompts(tmp_path):
    from grpo_zoo.testbed import task
    from grpo_zoo.testbed.warmup import warmup_example

    cfg = _tiny_warmup_cfg(tmp_path)
    questions = task.make_questions("train", 20, 0)
    rng = random.Random(0)
    kinds: dict[str, int] = {}
    for _ in range(400):
        prompt, target = warmup_example(rng.choice(questions), rng, cfg)
        kinds[prompt.variant] = kinds.get(prompt.variant, 0) + 1
        assert target.startswith("<think>") and "\\boxed{" in target
        assert ("Hint:" in prompt.problem) == (prompt.variant == "hint")
    assert set(kinds) == {"original", "paraphrase", "hint"}
    assert 0.15 < kinds["hint"] / 400 < 0.35 and 0.45 < kinds["paraphrase"] / 400 < 0.68  # 0.25 and 0.5625


def test_warmup_rejects_bad_settings(tmp_path):
    from grpo_zoo.testbed.warmup import ensure_testbed_model

    with pytest.raises(ValueError, match="warmup_lr_min"):
        ensure_testbed_model(_tiny_warmup_cfg(tmp_path, warmup_lr_min=1.0))
    with pytest.raises(ValueError, match="vision_pretrain"):
        ensure_testbed_model(_tiny_warmup_cfg(tmp_path, vision_pretrain_lr=0.0))
    with pytest.raises(ValueError, match="hint_share"):
        ensure_testbed_model(_tiny_warmup_cfg(tmp_path, warmup_hint_share=0.8, warmup_paraphrase_share=0.5))


def test_warmup_lr_holds_then_decays_to_the_minimum(tmp_path):
    from grpo_zoo.testbed.warmup import _lr_at

    cfg = _tiny_warmup_cfg(tmp_path, warmup_steps=10, warmup_hold_share=0.5, warmup_lr=1e-3, warmup_lr_min=1e-4)
    lrs = [_lr_at(step, cfg) for step in range(10)]
    assert lrs[:6] == [1e-3] * 6  # steps 0-4 held, step 5 starts the cosine at its top
    assert all(a > b for a, b in zip(lrs[5:], lrs[6:])) and lrs[-1] == pytest.approx(1e-4)


def test_micro_batched_nll_gradient_is_the_full_batch_gradient(tiny_dir, tmp_path):
    """Length-sorted micro-batches (`warmup_micro_batch_size`) change the padding, not the gradient or the loss."""
    from grpo_zoo.policy import Policy
    from grpo_zoo.testbed import task
    from grpo_zoo.testbed.warmup import accumulate_nll_gradient, teacher_forcing_batch, warmup_example

    policy = Policy.from_pretrained(str(tiny_dir))
    policy.freeze_vision()
    cfg = _tiny_warmup_cfg(tmp_path)
    rng = random.Random(0)
    pairs = [warmup_example(q, rng, cfg) for q in task.make_questions("train", 7, 0)]  # hinted prompts are longer
    batch = teacher_forcing_batch(policy, [p for p, _ in pairs], [t for _, t in pairs])
    params = [p for p in policy.parameters_for_training() if p.requires_grad]
    results = []
    for micro in (7, 3):
        for p in params:
            p.grad = None
        loss = accumulate_nll_gradient(policy, batch, micro)
        results.append((loss, [p.grad.clone() for p in params]))
    (full_loss, full_grads), (micro_loss, micro_grads) = results
    assert micro_loss == pytest.approx(full_loss, rel=1e-5) and full_loss > 0
    for a, b in zip(full_grads, micro_grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_linear_patch_embedding_is_the_same_function_and_switches_back(tiny_dir):
    from grpo_zoo.policy import Policy, image_features
    from grpo_zoo.testbed import task
    from grpo_zoo.testbed.vision_pretrain import linear_patch_embedding

    policy = Policy.from_pretrained(str(tiny_dir))
    images = [q.images[0] for q in task.make_questions("train", 3, 0)]
    with torch.no_grad():
        conv = torch.stack(image_features(policy, images))
        with linear_patch_embedding(policy.model) as switched:
            matmul = torch.stack(image_features(policy, images))
        again = torch.stack(image_features(policy, images))
    assert switched == 1
    torch.testing.assert_close(matmul, conv, rtol=1e-4, atol=1e-5)
    assert torch.equal(again, conv)  # the convolution is back
    assert not any("forward" in vars(m) for m in policy.model.modules())
