"""`rollout.backend: vllm`: sampling with a vLLM engine colocated with training on the same GPU.

The contract is the `hf` backend's: prompt-major rows, EOS kept with mask 1, vision tokens never
sampled, texts decoded by the policy's own tokenizer, plus the sampler's per-token log-probs
(`sampler_logprobs`, for rollout correction) and the weights version.

Colocation: the engine sleeps between rollouts (rollout.vllm.sleep_level: 1 = weights to CPU RAM,
KV cache freed; 2 = both freed), so training gets the GPU memory back, and wakes for the next
rollout. Weight sync: before a rollout whose version differs from the one the engine holds, the
trainer's weights (LoRA merged) are copied into the engine's model with its own `load_weights`,
which maps Hugging Face parameter names to vLLM's. The engine runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0 unless set), so the copy is GPU to GPU, with no pickling.
In a multi-process job (torchrun + train.backend deepspeed, ZeRO 1-2), each group of
tensor_parallel_size ranks runs one engine on its own GPUs (vLLM's external_launcher); the
prompts are split among the engines and the blocks all-gathered, so every rank gets the batch.

Images: vLLM resizes images with its own processor. Unless it is given the training processor's
min/max pixels, a prompt gets a different number of image tokens there than in training (the
"image tokens do not match" failure of peer frameworks, or silently off-policy samples), so
the engine is built with `mm_processor_kwargs` = the training processor's limits, and every
rollout checks that both sides count the same image tokens.

vLLM is imported when the backend is built, never at module import: CPU installs never need it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
from typing import TYPE_CHECKING, Any

import torch

from grpo_zoo.backends.rollout import Sampling, concat_rollouts, draw_shard_seeds, select_encoded, shard_bounds
from grpo_zoo.types import RolloutBatch

if TYPE_CHECKING:
    from grpo_zoo.config import Config
    from grpo_zoo.policy import EncodedPrompts, Policy

log = logging.getLogger(__name__)

_SUPPRESS_BIAS = -100.0  # logit bias of never-sampled ids: exp(-100) ~ 4e-44 is below float32 resolution


def vllm_available() -> bool:
    """True where the optional `vllm` package is installed (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def processor_pixel_limits(processor: Any) -> dict[str, int]:
    """{"min_pixels", "max_pixels"} the training processor resizes images into; {} for text-only.

    Qwen-VL image processors keep them as attributes (older transformers) or as
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels} (newer ones; a SizeDict in 5.x).
    """
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None:
        return {}
    lo, hi = getattr(image_processor, "min_pixels", None), getattr(image_processor, "max_pixels", None)
    size = getattr(image_processor, "size", None)  # a dict, or transformers 5's SizeDict (attributes)
    if (lo is None or hi is None) and size is not None:
        lo, hi = _size_field(size, "shortest_edge", lo), _size_field(size, "longest_edge", hi)
    if lo is None or hi is None:
        return {}
    return {"min_pixels": int(lo), "max_pixels": int(hi)}


def _size_field(size: Any, key: str, default: Any) -> Any:
    value = size.get(key) if isinstance(size, dict) else getattr(size, key, None)
    return default if value is None else value


def merged_state(policy: Policy) -> dict[str, torch.Tensor]:
    """The trainer's full weights under Hugging Face names, LoRA adapters merged in (W + scaling * B A).

    The merge is computed out of place: merging into the live weights and unmerging after
    would leave W off by float rounding at every sync, a drift that accumulates over a run.
    """
    model = policy.model
    if not (hasattr(model, "get_base_model") and hasattr(model, "peft_config")):
        return dict(model.state_dict())
    base = model.get_base_model()
    with torch.no_grad():
        state = {k.replace(".base_layer", ""): v for k, v in base.state_dict().items() if "lora_" not in k}
        for name, module in base.named_modules():
            if not (hasattr(module, "get_delta_weight") and hasattr(module, "active_adapters")):
                continue
            for adapter in module.active_adapters:
                if adapter in getattr(module, "lora_A", {}):
                    key = f"{name}.weight"
                    state[key] = state[key] + module.get_delta_weight(adapter).to(state[key].dtype)
    return state


def outputs_to_rollout(outputs: list[Any], encoded: EncodedPrompts, policy: Policy, sampling: Sampling,
                       image_token_id: int | None) -> RolloutBatch:
    """vLLM RequestOutputs (one per prompt, n = G completions each) as a RolloutBatch.

    Returns response_ids [N, T] right-padded with pad, response_mask [N, T] (1 up to and
    including the first EOS), sampler_logprobs [N, T] (0 where masked), rows prompt-major.
    Raises ValueError when vLLM's prompt has a different number of image tokens than training's.
    """
    from grpo_zoo.policy import response_mask_from_eos

    rows, logps = [], []
    for b, out in enumerate(outputs):
        _check_image_tokens(out, encoded.token_ids[b], image_token_id, b)
        completions = sorted(out.outputs, key=lambda c: c.index)
        if len(completions) != sampling.group_size:
            raise ValueError(f"vLLM returned {len(completions)} completions for prompt {b}, "
                             f"expected rollout.group_size = {sampling.group_size}")
        for c in completions:
            ids = list(c.token_ids)[: sampling.max_new_tokens] or [policy.pad_token_id]
            rows.append(torch.tensor(ids, dtype=torch.long))
            logps.append(torch.tensor([_token_logprob(c.logprobs, t, i) for i, t in enumerate(ids)]))
    width = max(len(r) for r in rows)
    response = torch.full((len(rows), width), policy.pad_token_id, dtype=torch.long)  # [N, T]
    sampler_logp = torch.zeros(len(rows), width)  # [N, T]
    for i, (r, lp) in enumerate(zip(rows, logps)):
        response[i, : len(r)] = r
        sampler_logp[i, : len(lp)] = lp
    lengths = torch.tensor([len(r) for r in rows])  # [N]
    real = torch.arange(width) < lengths[:, None]  # [N, T]; the pad id may itself be an EOS id
    mask = response_mask_from_eos(response, policy.eos_token_ids) * real  # [N, T]
    response = response.masked_fill(mask == 0, policy.pad_token_id)
    texts = policy.tokenizer.batch_decode(
        [row[: int(m.sum())].tolist() for row, m in zip(response, mask)], skip_special_tokens=True
    )
    return RolloutBatch(
        prompts=list(encoded.prompts),
        prompt_index=torch.arange(len(outputs)).repeat_interleave(sampling.group_size),  # [N]
        response_ids=response,
        response_mask=mask.float(),
        response_texts=texts,
        sampler_logprobs=sampler_logp * mask,
        extras={
            "prompt_token_ids": list(encoded.token_ids),
            "prompt_model_inputs": list(encoded.model_inputs),
            "temperature": float(sampling.temperature),
        },
    )


def _token_logprob(logprobs: Any, token: int, position: int) -> float:
    if not logprobs or position >= len(logprobs) or logprobs[position] is None:
        return 0.0
    entry = logprobs[position].get(token)
    return float(getattr(entry, "logprob", entry)) if entry is not None else 0.0


def _check_image_tokens(out: Any, train_ids: torch.Tensor, image_token_id: int | None, b: int) -> None:
    vllm_ids = getattr(out, "prompt_token_ids", None)
    if image_token_id is None or vllm_ids is None:
        return
    ours = int((train_ids == image_token_id).sum())
    theirs = sum(1 for t in vllm_ids if t == image_token_id)
    if ours != theirs:
        raise ValueError(
            f"prompt {b}: vLLM made {theirs} image tokens, the training processor {ours}: the two resize images "
            "differently. The engine gets the training processor's min/max pixels; check that the model "
            "directory's preprocessor_config.json sets them and that vLLM accepts mm_processor_kwargs for this model"
        )


def _process_group() -> tuple[int, int]:
    """(rank, world size) of the job's torch.distributed group; (0, 1) for a single process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather(local: RolloutBatch | None, encoded: EncodedPrompts, bounds: list[tuple[int, int]], world: int,
            tp: int, pad_token_id: int) -> RolloutBatch:
    """Every engine's block (from the first rank of each tp group), in prompt order, on every rank."""
    import torch.distributed as dist

    shares: list[Any] = [None] * world
    dist.all_gather_object(shares, local)  # CPU tensors and texts; prompts and images never travel
    parts = []
    for group, (a, b) in enumerate(bounds):
        part = shares[group * tp]
        part.prompts = list(encoded.prompts[a:b])
        part.extras.update(prompt_token_ids=list(encoded.token_ids[a:b]),
                           prompt_model_inputs=list(encoded.model_inputs[a:b]))
        parts.append(part)
    return concat_rollouts(parts, pad_token_id)


class VllmRollout:
    """A vLLM engine over the trainer's GPU, synced to the trainer's weights once per version."""

    external_sampler = True  # vLLM's kernels differ from the trainer's: rollout correction defaults on

    def __init__(self, cfg: Config, policy: Policy, model_path: str):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in process: GPU-to-GPU sync
        from vllm import LLM
        from vllm.engine.arg_utils import EngineArgs

        vc = cfg.rollout.vllm
        self.policy = policy
        self.sleep_level = vc.sleep_level
        self.version: int | None = None  # the engine's weights are the checkpoint's until the first sync
        self.asleep = False
        known = {f.name for f in dataclasses.fields(EngineArgs)}
        optional = {
            "logprobs_mode": "processed_logprobs",  # after temperature: what was sampled from, as logprobs() computes
            "generation_config": "vllm",  # ignore the checkpoint's sampling defaults (top_k, repetition penalty)
        }
        kwargs: dict[str, Any] = {k: v for k, v in optional.items() if k in known}
        self.rank, self.world = _process_group()
        self.tp = vc.tensor_parallel_size
        if self.world > 1:
            if self.world % self.tp:
                raise ValueError(f"rollout.vllm.tensor_parallel_size = {self.tp} must divide the {self.world} "
                                 "processes of the job")
            if cfg.train.backend == "deepspeed" and cfg.train.deepspeed.zero_stage == 3:
                raise ValueError("rollout.backend vllm syncs whole weights from every rank; ZeRO stage 3 shards "
                                 "them: use train.deepspeed.zero_stage 1 or 2, or rollout.backend hf")
            # One engine per group of tp ranks, in these processes, on each rank's own GPU (LOCAL_RANK).
            kwargs["distributed_executor_backend"] = "external_launcher"
        pixels = processor_pixel_limits(policy.processor)
        if pixels:
            kwargs["mm_processor_kwargs"] = pixels
            kwargs["limit_mm_per_prompt"] = {"image": vc.max_images_per_prompt}
        self.llm = LLM(
            model=model_path,
            dtype=cfg.model.dtype,
            seed=cfg.train.seed,
            gpu_memory_utilization=vc.gpu_memory_utilization,
            enable_sleep_mode=vc.sleep_level > 0,
            enforce_eager=vc.enforce_eager,
            max_model_len=vc.max_model_len or cfg.data.max_prompt_length + cfg.rollout.max_new_tokens,
            tensor_parallel_size=vc.tensor_parallel_size,
            **kwargs,
        )
        config = policy.model.config
        self.image_token_id = getattr(config, "image_token_id", None) if policy.is_vlm else None
        self.logit_bias = {int(i): _SUPPRESS_BIAS for i in policy.suppressed_token_ids}
        self._sleep()

    def sync_weights(self, version: int) -> None:
        """Copy the trainer's weights into the engine unless it already holds `version`."""
        if version == self.version:
            return
        state = merged_state(self.policy)
        items = list(state.items())
        self.llm.apply_model(lambda model: model.load_weights(iter(items)))
        self.version = version

    def generate(self, encoded: EncodedPrompts, sampling: Sampling, *, version: int) -> RolloutBatch:
        """Sample on this engine; in a multi-process job each engine samples a block and all gather.

        Seeds are per prompt (one draw of the step's RNG, as every backend draws), so which engine
        samples a prompt, and what vLLM batches with it, does not change its responses.
        """
        self._wake()
        self.sync_weights(version)
        seeds = draw_shard_seeds(len(encoded))  # [B], drawn alike on every rank: the RNGs stay in lockstep
        if self.world == 1:
            try:
                batch = self._sample(encoded, seeds, sampling)
            finally:
                self._sleep()
        else:
            bounds = shard_bounds(len(encoded), self.world // self.tp)
            group = self.rank // self.tp
            local = None
            try:
                if group < len(bounds):
                    a, b = bounds[group]
                    local = self._sample(select_encoded(encoded, a, b), seeds[a:b], sampling)
                    local.prompts, local.extras = [], {"temperature": local.extras["temperature"]}
            finally:
                self._sleep()
            batch = _gather(local, encoded, bounds, self.world, self.tp, self.policy.pad_token_id)
        batch.policy_version = version
        return batch

    def _sample(self, encoded: EncodedPrompts, seeds: list[int], sampling: Sampling) -> RolloutBatch:
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=sampling.group_size,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=-1,
                min_p=0.0,
                repetition_penalty=1.0,
                max_tokens=sampling.max_new_tokens,
                stop_token_ids=list(self.policy.eos_token_ids),
                logprobs=0,  # the sampled token's log-prob only
                logit_bias=self.logit_bias or None,
                seed=seed,
                skip_special_tokens=True,
            )
            for seed in seeds
        ]
        requests = [
            {"prompt": text, "multi_modal_data": {"image": list(p.images)}} if p.images else {"prompt": text}
            for text, p in zip(encoded.texts, encoded.prompts)
        ]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return outputs_to_rollout(outputs, encoded, self.policy, sampling, self.image_token_id)

    def _sleep(self) -> None:
        if self.sleep_level > 0 and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True
            if self.sleep_level >= 2:
                self.version = None  # level 2 drops the weights: the next wake must load them again

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            del llm
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


__all__ = ["VllmRollout", "merged_state", "outputs_to_rollout", "processor_pixel_limits", "vllm_available"]
