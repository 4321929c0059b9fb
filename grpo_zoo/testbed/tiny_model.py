"""Build the testbed policy: a Qwen2.5-VL-architecture model of ~1M text + ~0.8M vision parameters.

Everything is built offline from configs: random weights (seeded), the character-level
tokenizer, the PIL image processor fixed at 112 x 112 pixels (64 patches -> 16 image tokens)
and a short chat template. The written directory is a standard Qwen2.5-VL checkpoint:
`AutoModelForImageTextToText` / `AutoProcessor` (after `import grpo_zoo.hf_compat`) and
`grpo_zoo.policy.Policy.from_pretrained` load it, with bit-identical logits.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from grpo_zoo.hf_compat import Qwen2_5_VLProcessor
from grpo_zoo.testbed.tokenizer import build_tokenizer


@dataclass(frozen=True)
class TinyVLMSpec:
    """Sizes of the testbed policy (the defaults were measured to fit a CPU RL step in ~1 s)."""

    hidden: int = 128  # text width; the LM has ~1.0M parameters at these sizes
    layers: int = 4
    heads: int = 4  # head_dim = hidden / heads = 32
    kv_heads: int = 2  # grouped-query attention as in Qwen2.5
    mlp: int = 512
    mrope_section: tuple[int, int, int] = (4, 6, 6)  # (t, h, w) rotary pairs; must sum to head_dim / 2
    rope_theta: float = 10000.0  # short sequences (~200 tokens): the small base keeps positions distinct
    vision_hidden: int = 128
    vision_depth: int = 2
    vision_heads: int = 4
    vision_mlp: int = 256  # ~0.8M vision parameters with the patch embedding and merger
    patch: int = 14
    merge: int = 2  # 2 x 2 patches -> one image token
    pixels: int = 112 * 112  # min = max pixels: every image becomes 8 x 8 patches = 16 image tokens

    def __post_init__(self) -> None:
        head_dim = self.hidden // self.heads
        if self.hidden % self.heads or sum(self.mrope_section) * 2 != head_dim:
            raise ValueError(
                f"TinyVLMSpec: mrope_section {self.mrope_section} must sum to head_dim / 2 = {head_dim // 2} "
                f"(hidden {self.hidden} / heads {self.heads}); change mrope_section or heads"
            )


def tiny_config(spec: TinyVLMSpec, vocab_size: int, ids: dict[str, int]) -> Qwen2_5_VLConfig:
    """The Qwen2.5-VL config for `spec`, with token ids taken from the tokenizer."""
    text = {
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.mlp,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "max_position_embeddings": 4096,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": spec.rope_theta,
            "mrope_section": list(spec.mrope_section),
        },
        "bos_token_id": None,
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "tie_word_embeddings": True,
    }
    vision = {
        "depth": spec.vision_depth,
        "hidden_size": spec.vision_hidden,
        "intermediate_size": spec.vision_mlp,
        "num_heads": spec.vision_heads,
        "patch_size": spec.patch,
        "spatial_merge_size": spec.merge,
        "temporal_patch_size": 2,
        "out_hidden_size": spec.hidden,
        "window_size": spec.patch * spec.merge * 4,
        "fullatt_block_indexes": [spec.vision_depth - 1],
        "tokens_per_second": 2,
    }
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )


def special_token_ids(tokenizer) -> dict[str, int]:
    """The ids of the chat and vision special tokens `tiny_config` and `generation_config` need."""
    return {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>", "<|image_pad|>",
                                                           "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}


def generation_config(ids: dict[str, int]) -> GenerationConfig:
    """Stop at <|im_end|> or <|endoftext|>; pad with <|endoftext|>."""
    return GenerationConfig(eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"])


def tiny_processor(spec: TinyVLMSpec, tokenizer) -> Qwen2_5_VLProcessor:
    """The torchvision-free Qwen2.5-VL processor: the PIL image processor at `spec.pixels` + `tokenizer`."""
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": spec.pixels, "longest_edge": spec.pixels},
        patch_size=spec.patch,
        temporal_patch_size=2,
        merge_size=spec.merge,
    )
    return Qwen2_5_VLProcessor(image_processor, tokenizer, chat_template=tokenizer.chat_template)


def build_tiny_vlm(out_dir: Path, seed: int, spec: TinyVLMSpec | None = None) -> Path:
    """Write a randomly initialised tiny Qwen2.5-VL checkpoint (config, safetensors, tokenizer, processor).

    Args:
        out_dir: target directory; replaced atomically (built in a sibling temp dir, then renamed).
        seed: torch seed for the weights; the same seed gives bit-identical weights.
        spec: sizes; None = TinyVLMSpec().
    Returns:
        out_dir.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    spec = spec or TinyVLMSpec()
    out_dir = Path(out_dir)
    tokenizer = build_tokenizer()
    ids = special_token_ids(tokenizer)
    config = tiny_config(spec, len(tokenizer), ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(config).eval()
    model.generation_config = generation_config(ids)
    processor = tiny_processor(spec, tokenizer)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def count_parameters(model: torch.nn.Module) -> dict[str, int]:
    """Parameter counts of a Qwen2.5-VL model: text (tied embedding counted once) and vision."""
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    total = sum(p.numel() for p in model.parameters())  # parameters() yields tied weights once
    return {"text": total - vision, "vision": vision, "total": total}
