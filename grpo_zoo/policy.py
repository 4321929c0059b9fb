"""The `hf` policy: any local Hugging Face causal LM or image-text-to-text model, optionally with LoRA.

One object does the three things a GRPO step needs from the model:
    encoded = policy.encode(prompts)                       # chat template, images, left padding
    rollout = policy.generate(encoded, group_size=G, ...)  # N = B * G sampled responses
    logp, entropy = policy.logprobs(rollout, rows)         # per-token log-probs, any subset of rows

Rows are prompt-major: row i answers prompts[rollout.prompt_index[i]]. The prompt tensors a
forward needs are kept per prompt in `rollout.extras` ("prompt_*" keys, one item per prompt,
the engine's convention), so any subset of rows re-batches with only the padding it needs.
Nothing here downloads: every load is `local_files_only`.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image
from transformers.modeling_outputs import BaseModelOutputWithPooling

import grpo_zoo.hf_compat  # noqa: F401  (registers the torchvision-free Qwen-VL processors)
from grpo_zoo.hf_compat import load_processor
from grpo_zoo.shared_prompts import response_logits, sample
from grpo_zoo.types import Prompt, RolloutBatch

IMAGE_TAG = "<image>"
# Processor outputs aligned with the tokens (padded with the ids); every other output is
# per image and concatenated along dim 0 (pixel_values [P, D], image_grid_thw [I, 3]).
TOKEN_ALIGNED = ("mm_token_type_ids", "token_type_ids")
# Vision special tokens: sampling one corrupts the next forward ("Image features and image
# tokens do not match") or the 3D positions, so they are never sampled.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class EncodedPrompts:
    """B prompts after the chat template and the processor.

    `input_ids`/`attention_mask` are the left-padded batch; `token_ids` and `model_inputs`
    keep each prompt unpadded so that any subset re-batches (`batch`).
    """

    prompts: list[Prompt]
    input_ids: torch.Tensor  # [B, L] long, left-padded
    attention_mask: torch.Tensor  # [B, L] long
    token_ids: list[torch.Tensor]  # [B] x [L_b] long, unpadded
    model_inputs: list[dict[str, torch.Tensor]]  # [B] per prompt: pixel_values [P_b, D], image_grid_thw, ...
    texts: list[str]  # [B] the rendered chat text
    pad_token_id: int

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def lengths(self) -> torch.Tensor:  # [B] long, prompt tokens (image tokens included)
        return torch.tensor([len(t) for t in self.token_ids], dtype=torch.long)


def collate_prompts(token_ids: Sequence[torch.Tensor], model_inputs: Sequence[dict[str, torch.Tensor]],
                    pad_token_id: int) -> dict[str, torch.Tensor]:
    """Left-pad prompts to their longest and stack their processor outputs.

    Args:
        token_ids: n prompts' unpadded ids ([L_i] each), repeats allowed (one per response row).
        model_inputs: their per-prompt processor outputs, same order.
    Returns:
        input_ids [n, L], attention_mask [n, L], token-aligned keys left-padded with 0, per-image
        keys concatenated in row order (so the vision features line up with the image tokens).
    """
    width = max(len(t) for t in token_ids)
    out: dict[str, torch.Tensor] = {
        "input_ids": torch.stack([F.pad(t, (width - len(t), 0), value=pad_token_id) for t in token_ids]),
        "attention_mask": torch.stack(
            [F.pad(torch.ones_like(t), (width - len(t), 0), value=0) for t in token_ids]
        ),
    }
    keys = sorted({k for inputs in model_inputs for k in inputs})
    for key in keys:
        if key in TOKEN_ALIGNED:
            out[key] = torch.stack(
                [F.pad(inputs.get(key, torch.zeros_like(t)), (width - len(t), 0), value=0)
                 for t, inputs in zip(token_ids, model_inputs)]
            )
        else:
            parts = [inputs[key] for inputs in model_inputs if key in inputs]
            if parts:
                out[key] = torch.cat(parts)
    return out


class Policy:
    """A Hugging Face model + its processor (or tokenizer) behind the engine's rollout/log-prob API."""

    def __init__(self, model: torch.nn.Module, processor: Any, *, device: torch.device | str = "cpu",
                 prefix_sharing: bool = True):
        self.model = model
        self.prefix_sharing = prefix_sharing  # each distinct prompt through the model once (shared_prompts.py)
        self.processor = processor
        self.device = torch.device(device)
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.is_vlm = getattr(processor, "image_processor", None) is not None
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token  # common for base LMs; pad is always masked
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        self.eos_token_ids = self._eos_ids()
        self.suppressed_token_ids = self._suppressed_ids()
        base = self._base_model()
        self._uses_mrope = hasattr(getattr(base, "model", None), "get_rope_index")
        self._share_vision = (
            self.is_vlm
            and hasattr(base, "get_image_features")
            and "mm_encoder_outputs" in inspect.signature(base.forward).parameters
        )
        self._dtype = next(base.parameters()).dtype

    # ---------------------------------------------------------------- loading and saving

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        lora: Any | None = None,
        gradient_checkpointing: bool = False,
        freeze_vision_tower: bool = False,
        attn_implementation: str | None = None,
        prefix_sharing: bool = True,
    ) -> Policy:
        """Load a local model directory (never downloads).

        Args:
            path: a directory with config.json, weights and tokenizer (+ processor files for a VLM).
            device: "cpu", "cuda", "cuda:1", or "auto" (cuda when available).
            dtype: "float32" | "bfloat16" | "float16"; fp32 is fastest for the tiny testbed model.
            lora: grpo_zoo.config.LoraConfig; adapters are added only when `lora.enabled`.
            gradient_checkpointing: recompute activations in backward (long responses, big models).
            freeze_vision_tower: train only the language side (see `freeze_vision`).
            attn_implementation: passed to transformers ("sdpa", "eager", ...); None = its default.
            prefix_sharing: run each distinct prompt once and its responses on its cached keys/values
                (grpo_zoo/shared_prompts.py); False = HF generate and one full forward per row.
        """
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
        from transformers.utils import logging as hf_logging

        if dtype not in DTYPES:
            raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got '{dtype}'")
        directory = Path(path).expanduser()
        if not (directory / "config.json").is_file():
            raise ValueError(
                f"model.path '{path}' is not a local model directory (no config.json); grpo_zoo never downloads, "
                "so download the checkpoint first or use `testbed`"
            )
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        config = json.loads((directory / "config.json").read_text())
        auto_cls = AutoModelForImageTextToText if "vision_config" in config else AutoModelForCausalLM
        kwargs: dict[str, Any] = {"dtype": DTYPES[dtype], "local_files_only": True}
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        hf_logging.disable_progress_bar()  # one line per load is noise in training logs
        model = auto_cls.from_pretrained(str(directory), **kwargs).to(device)
        processor = load_processor(str(directory))
        if gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        if lora is not None and getattr(lora, "enabled", False):
            model = _add_lora(model, lora)
        policy = cls(model, processor, device=device, prefix_sharing=prefix_sharing)
        if freeze_vision_tower:
            policy.freeze_vision()
        return policy

    def freeze_vision(self) -> int:
        """Stop training the vision tower (`.visual.` parameters); returns how many tensors were frozen.

        EasyR1/verl's `freeze_vision_tower`: RL then moves only the language model, and the image
        features the policy learned to read stay as they are. A text-only model has nothing to freeze.
        """
        frozen = 0
        for name, param in self.model.named_parameters():
            if ".visual." in f".{name}" and param.requires_grad:
                param.requires_grad_(False)
                frozen += 1
        return frozen

    def save(self, path: str | Path, *, merge_lora: bool = True) -> Path:
        """Write a directory that `Policy.from_pretrained` (and plain transformers) load.

        With LoRA, `merge_lora=True` saves merged full weights (from a copy; the live adapters
        keep training), False saves the adapter alone (PEFT layout, needs the base to load).
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        model = self.model
        if _is_peft(model) and merge_lora:
            model = copy.deepcopy(model).merge_and_unload()
        model.save_pretrained(path)
        self.processor.save_pretrained(path)
        return path

    def parameters_for_training(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates (all of them, or the LoRA adapters)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    # ---------------------------------------------------------------- encoding

    def encode(self, prompts: list[Prompt], *, template: str = "{problem}", system_prompt: str = "") -> EncodedPrompts:
        """Render each prompt with the chat template and run the processor.

        `template` wraps the problem text ("{problem}" is replaced literally, so braces such as
        "\\boxed{}" in it are safe); each "<image>" tag becomes the model's image placeholder.
        Images without a tag go before the text (the EasyR1/verl convention).

        Raises:
            ValueError: empty prompt list; more <image> tags than images; images for a text-only model.
        """
        if not prompts:
            raise ValueError("Policy.encode: prompts is empty")
        if "{problem}" not in template:
            raise ValueError(f"data.prompt_template must contain '{{problem}}', got {template!r}")
        token_ids, model_inputs, texts = [], [], []
        for prompt in prompts:
            text = self._render(prompt, template, system_prompt)
            ids, inputs = self._process(text, prompt.images)
            token_ids.append(ids)
            model_inputs.append(inputs)
            texts.append(text)
        batch = collate_prompts(token_ids, [{} for _ in token_ids], self.pad_token_id)
        return EncodedPrompts(
            prompts=list(prompts),
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_ids=token_ids,
            model_inputs=model_inputs,
            texts=texts,
            pad_token_id=self.pad_token_id,
        )

    def _render(self, prompt: Prompt, template: str, system_prompt: str) -> str:
        text = template.replace("{problem}", prompt.problem)
        n_tags = text.count(IMAGE_TAG)
        if n_tags > len(prompt.images):
            raise ValueError(
                f"question {prompt.question_id}: the prompt has {n_tags} '{IMAGE_TAG}' tag(s) but "
                f"{len(prompt.images)} image(s); every tag needs an image"
            )
        if prompt.images and not self.is_vlm:
            raise ValueError(
                f"question {prompt.question_id} has images but the model at hand is text-only (no image processor)"
            )
        messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
        if self.is_vlm:
            content: list[dict[str, str]] = [{"type": "image"}] * (len(prompt.images) - n_tags)
            for i, piece in enumerate(text.split(IMAGE_TAG)):
                if i:
                    content.append({"type": "image"})
                if piece:
                    content.append({"type": "text", "text": piece})
            messages.append({"role": "user", "content": content})
        else:
            messages.append({"role": "user", "content": text})
        owner = self.processor if getattr(self.processor, "chat_template", None) else self.tokenizer
        if not getattr(owner, "chat_template", None):
            return (system_prompt + "\n\n" + text) if system_prompt else text  # a base model: raw text
        return owner.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _process(self, text: str, images: list[Image.Image]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self.is_vlm:
            out = self.processor(text=[text], images=list(images) or None, return_tensors="pt",
                                 add_special_tokens=False)
        else:
            out = self.tokenizer([text], return_tensors="pt", add_special_tokens=False)
        ids = out["input_ids"][0]
        inputs = {k: (v[0] if k in TOKEN_ALIGNED else v) for k, v in out.items()
                  if k not in ("input_ids", "attention_mask") and isinstance(v, torch.Tensor)}
        return ids, inputs

    # ---------------------------------------------------------------- sampling

    @torch.no_grad()
    def generate(self, encoded: EncodedPrompts, *, group_size: int, temperature: float, top_p: float,
                 max_new_tokens: int, greedy: bool = False) -> RolloutBatch:
        """Sample `group_size` responses per prompt (torch's global RNG).

        With `prefix_sharing` each prompt is run once and its G rows decode on copies of its cache
        (`shared_prompts.sample`); otherwise HF generate runs every row's prompt. Rows are
        prompt-major (rows b*G .. b*G+G-1 answer prompt b). Sampling is plain
        softmax(logits / temperature) with nucleus `top_p`; the model's own generation_config
        (top_k, repetition penalty, ...) is overridden so old log-probs match the sampler.
        Vision special tokens and ids the tokenizer does not know are never sampled. A row
        stops at its first EOS (kept, mask 1); the batch stops when every row has.

        Returns:
            RolloutBatch with response_ids [N, T] (right-padded with pad), response_mask [N, T]
            float, T = the longest response, and extras "prompt_token_ids" / "prompt_model_inputs".
        """
        if group_size < 1 or max_new_tokens < 1:
            raise ValueError(f"rollout.group_size and rollout.max_new_tokens must be >= 1, got "
                             f"{group_size} and {max_new_tokens}")
        if not greedy and (temperature <= 0 or not 0 < top_p <= 1):
            raise ValueError(f"rollout.temperature must be > 0 and top_p in (0, 1], got {temperature}, {top_p}")
        b = len(encoded)
        prompt_index = torch.arange(b).repeat_interleave(group_size)  # [N]
        if self.prefix_sharing:
            batch = self._batch(encoded.token_ids, encoded.model_inputs, list(range(b)))
            response = sample(self, batch, prompt_index.to(self.device), max_new_tokens=max_new_tokens,
                              temperature=temperature, top_p=top_p, greedy=greedy).cpu()
        else:
            response = self._hf_generate(encoded, prompt_index, temperature=temperature, top_p=top_p,
                                         max_new_tokens=max_new_tokens, greedy=greedy)
        mask = response_mask_from_eos(response, self.eos_token_ids)  # [N, T']
        width = max(int(mask.sum(-1).max()), 1)
        response, mask = response[:, :width], mask[:, :width]
        response = response.masked_fill(mask == 0, self.pad_token_id)
        texts = self.tokenizer.batch_decode(
            [row[: int(m.sum())].tolist() for row, m in zip(response, mask)], skip_special_tokens=True
        )
        return RolloutBatch(
            prompts=list(encoded.prompts),
            prompt_index=prompt_index,
            response_ids=response,
            response_mask=mask.float(),
            response_texts=texts,
            extras={
                "prompt_token_ids": list(encoded.token_ids),
                "prompt_model_inputs": list(encoded.model_inputs),
                "temperature": float(temperature) if not greedy else 1.0,
            },
        )

    def _hf_generate(self, encoded: EncodedPrompts, prompt_index: torch.Tensor, *, temperature: float, top_p: float,
                     max_new_tokens: int, greedy: bool) -> torch.Tensor:
        """Response ids [N, T'] from HF generate over every row's prompt (the path without prefix sharing)."""
        from transformers import GenerationConfig

        batch = self._batch(encoded.token_ids, encoded.model_inputs, prompt_index.tolist())
        # Every knob that reshapes the distribution is pinned (a checkpoint's own defaults, e.g.
        # Qwen's top_k=1 and repetition_penalty=1.05, would otherwise fill the unset ones).
        shaping: dict[str, Any] = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "num_beams": 1}
        if not greedy:
            shaping.update(temperature=float(temperature), top_p=float(top_p), top_k=0, min_p=0.0, typical_p=1.0)
        gen_config = GenerationConfig(
            do_sample=not greedy,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            suppress_tokens=self.suppressed_token_ids or None,
            **shaping,
        )
        sequences = self.model.generate(**batch, generation_config=gen_config)
        return sequences[:, batch["input_ids"].shape[1]:].cpu()  # [N, T']

    # ---------------------------------------------------------------- log-probs

    def logprobs(self, rollout: RolloutBatch, rows: torch.Tensor, *, with_entropy: bool = False,
                 temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log pi(y_t | x, y_<t) of the response tokens of `rows` (grad flows under grad).

        Args:
            rollout: a RolloutBatch from `generate` (or a subset/concatenation keeping its
                "prompt_*" extras).
            rows: [n] long row indices (or [N] bool); any subset, any order.
            with_entropy: also return the per-token entropy of the full next-token distribution.
            temperature: log-probs of softmax(logits / temperature); 1.0 = the raw model.
        Returns:
            logp [n, T] and entropy [n, T] (or None), T = rollout.response_ids.shape[1], zero
            where response_mask is 0. The forward uses only the padding these rows need. When
            rows share prompts (and `prefix_sharing` is on) each prompt runs once and its rows
            continue from its cache (`shared_prompts.response_logits`); otherwise each row runs
            prompt + response, and for Qwen-VL the model derives its 3D (mrope) positions from
            the ids, image grids and attention mask, as generate did.
        """
        rows = rows.nonzero().flatten() if rows.dtype == torch.bool else rows.long()
        full_t = rollout.response_ids.shape[1]
        n = int(rows.numel())
        if n == 0:
            empty = torch.zeros(0, full_t, device=self.device)
            return empty, (empty.clone() if with_entropy else None)
        token_ids, model_inputs = _prompt_extras(rollout)
        p_idx = rollout.prompt_index[rows].tolist()
        mask = rollout.response_mask[rows]  # [n, T]
        width = max(int(mask.sum(-1).max()), 1)  # only as many columns as these rows use
        mask = mask[:, :width].long()
        response = rollout.response_ids[rows][:, :width].masked_fill(mask == 0, self.pad_token_id)
        distinct = list(dict.fromkeys(p_idx))
        recompute = self._checkpointing() and torch.is_grad_enabled()
        if self.prefix_sharing and len(distinct) < n and not recompute:  # sharing pays when prompts repeat
            where = {p: i for i, p in enumerate(distinct)}
            prompt_of_row = torch.tensor([where[p] for p in p_idx], device=self.device)
            logits = response_logits(self, self._batch(token_ids, model_inputs, distinct), prompt_of_row,
                                     response.to(self.device), mask.to(self.device))  # [n, width, V]
        else:
            with checkpointing_layers_active(self.model, recompute):  # the vision tower's blocks too
                inputs = self._forward_inputs(self._batch(token_ids, model_inputs, p_idx), response, mask)
                logits = self.model(**inputs, use_cache=False, logits_to_keep=width + 1).logits[:, :-1]
        logits = logits.float() / temperature  # position j predicts response token j
        logp_all = torch.log_softmax(logits, dim=-1)  # [n, width, V]
        logp = logp_all.gather(-1, response.to(logits.device).unsqueeze(-1)).squeeze(-1)  # [n, width]
        keep = mask.to(logp.device, logp.dtype)
        logp = F.pad(logp * keep, (0, full_t - width))
        entropy = None
        if with_entropy:
            entropy = -(logp_all.exp() * logp_all).sum(-1)  # [n, width]
            entropy = F.pad(entropy * keep, (0, full_t - width))
        return logp, entropy

    def _checkpointing(self) -> bool:
        """Whether gradient (activation) checkpointing is switched on (`model.gradient_checkpointing`)."""
        base = self._base_model()
        flag = "is_activation_checkpointing" if hasattr(type(base), "is_activation_checkpointing") else \
            "is_gradient_checkpointing"  # the name before transformers 5.x
        return bool(getattr(base, flag, False))

    def _forward_inputs(self, batch: dict[str, Any], response: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
        n, width = response.shape
        inputs = dict(batch)
        inputs["input_ids"] = torch.cat([batch["input_ids"], response.to(self.device)], dim=1)
        inputs["attention_mask"] = torch.cat([batch["attention_mask"], mask.to(self.device)], dim=1)
        for key in TOKEN_ALIGNED:
            if key in inputs:
                pad = torch.zeros(n, width, dtype=inputs[key].dtype, device=self.device)  # response = text
                inputs[key] = torch.cat([inputs[key], pad], dim=1)
        has_images = "image_grid_thw" in inputs or "video_grid_thw" in inputs
        if not (self._uses_mrope and has_images):
            # Positions count real tokens only, as generate does; with images the Qwen-VL model
            # computes its own 3D positions from ids + grids + mask instead.
            positions = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            inputs["position_ids"] = positions
        return inputs

    def _batch(self, token_ids: list[torch.Tensor], model_inputs: list[dict[str, torch.Tensor]],
               p_idx: list[int]) -> dict[str, Any]:
        """Model inputs for rows answering prompts p_idx (repeats allowed), on the device.

        The vision tower runs once per distinct prompt, not once per row (G times fewer image
        encodings); its features are handed to the model as `mm_encoder_outputs`, so gradients
        from every row of a prompt reach the vision tower through the one shared encoding.
        """
        batch: dict[str, Any] = collate_prompts([token_ids[i] for i in p_idx], [model_inputs[i] for i in p_idx],
                                                self.pad_token_id)
        batch = {k: v.to(self.device) for k, v in batch.items()}
        if not (self._share_vision and "pixel_values" in batch):
            return batch
        distinct = [i for i in dict.fromkeys(p_idx) if "pixel_values" in model_inputs[i]]
        pixels = torch.cat([model_inputs[i]["pixel_values"] for i in distinct]).to(self.device, self._dtype)
        grids = [model_inputs[i]["image_grid_thw"] for i in distinct]
        features = self._base_model().get_image_features(
            pixel_values=pixels, image_grid_thw=torch.cat(grids).to(self.device)
        ).pooler_output  # one [tokens, d] tensor per image, in order
        per_prompt: dict[int, list[torch.Tensor]] = {}
        start = 0
        for i, grid in zip(distinct, grids):
            per_prompt[i] = list(features[start : start + len(grid)])
            start += len(grid)
        row_features = [f for i in p_idx for f in per_prompt.get(i, [])]
        del batch["pixel_values"]
        batch["mm_encoder_outputs"] = {"image": BaseModelOutputWithPooling(pooler_output=row_features)}
        return batch

    # ---------------------------------------------------------------- helpers

    def _base_model(self) -> torch.nn.Module:
        return self.model.get_base_model() if _is_peft(self.model) else self.model

    def _eos_ids(self) -> list[int]:
        ids: list[int] = []
        gen_eos = getattr(getattr(self._base_model(), "generation_config", None), "eos_token_id", None)
        for value in (gen_eos, self.tokenizer.eos_token_id):
            for i in ([value] if isinstance(value, int) else (value or [])):
                if int(i) not in ids:
                    ids.append(int(i))
        if not ids:
            raise ValueError("the model has no EOS token: set tokenizer.eos_token or generation_config.eos_token_id")
        return ids

    def _suppressed_ids(self) -> list[int]:
        config = self._base_model().config
        ids = {self.tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS if t in self.tokenizer.get_vocab()}
        for name in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
                     "image_token_index"):
            value = getattr(config, name, None)
            if isinstance(value, int):
                ids.add(value)
        vocab_size = self._base_model().get_output_embeddings().weight.shape[0]
        ids.update(range(len(self.tokenizer), vocab_size))  # padded embedding rows no text decodes to
        return sorted(i for i in ids if i not in self.eos_token_ids and 0 <= i < vocab_size)


@contextmanager
def checkpointing_layers_active(model: torch.nn.Module, active: bool) -> Iterator[None]:
    """Let HF's checkpointing layers recompute their activations in backward, and change nothing else.

    transformers checkpoints a layer only while that layer is in training mode, and the policy stays
    in eval mode (no dropout, so sampling and the update see the same model). Only the layers' own
    `training` flag is set here, not their submodules': attention and dropout inside stay in eval.
    """
    if not active:
        yield
        return
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]
    before = [m.training for m in layers]
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer, mode in zip(layers, before):
            layer.training = mode


def response_mask_from_eos(response: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """[N, T] long mask: 1 up to and including each row's first EOS, 0 after; all 1 without an EOS."""
    is_eos = torch.isin(response, torch.tensor(list(eos_ids), dtype=response.dtype))
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # strictly after the first EOS
    return (~after_eos).long()


def image_features(policy: Policy, images: Sequence[Image.Image]) -> list[torch.Tensor]:
    """The vision tower's output per image, [P_i, d] each, in the model's dtype and device, with grad.

    These are the visual tokens the language model receives (after Qwen's 2 x 2 patch merger),
    in the merger's row-major order. Images are resized by the policy's processor exactly as in `encode`.
    """
    if not policy.is_vlm:
        raise ValueError("image_features: the policy is text-only (no image processor)")
    if not images:
        return []
    out = policy.processor.image_processor(images=list(images), return_tensors="pt")
    model = policy._base_model()
    dtype = next(model.parameters()).dtype
    pixels, grids = out["pixel_values"].to(policy.device, dtype), out["image_grid_thw"].to(policy.device)
    features = model.get_image_features(pixel_values=pixels, image_grid_thw=grids)
    return list(getattr(features, "pooler_output", features))


@torch.no_grad()
def vision_patch_features(policy: Policy, images: Sequence[Image.Image]) -> list[torch.Tensor]:
    """`image_features` without grad, float32 on CPU: the patch features Durian's perceptual entropy
    H(image) is computed from (ALGORITHMS.md, "Durian")."""
    if not policy.is_vlm:
        raise ValueError("vision_patch_features: the policy is text-only (no image processor)")
    return [f.float().cpu() for f in image_features(policy, images)]


def _prompt_extras(rollout: RolloutBatch) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    try:
        return rollout.extras["prompt_token_ids"], rollout.extras["prompt_model_inputs"]
    except KeyError:
        raise ValueError(
            "Policy.logprobs: rollout.extras lacks 'prompt_token_ids'/'prompt_model_inputs'; "
            "pass a RolloutBatch made by Policy.generate (subsets must keep its prompt_* extras)"
        ) from None


def _is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "get_base_model") and hasattr(model, "peft_config")


def _add_lora(model: torch.nn.Module, lora: Any) -> torch.nn.Module:
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    if lora.r < 1:
        raise ValueError(f"model.lora.r must be >= 1, got {lora.r}")
    peft_config = PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                 target_modules=list(lora.target_modules), bias="none")
    return get_peft_model(model, peft_config)
