"""Each distinct prompt through the model once: its responses attend to its cached keys and values.

A GRPO batch has G responses per prompt, and on the testbed a prompt (image tokens included)
is ~4x as long as a response. A plain forward over every prompt + response row processes each
prompt G times, in sampling (the prefill) and again in every log-prob pass of the update. Here
the prompts go through the model once (`prompt_pass`), their key/value cache is expanded to
one copy per row (`Cache.reorder_cache`, differentiable: gradients from all G rows flow back
into the one prompt pass), and only the response tokens run on top of it. Causal attention
makes this the same computation: a prompt token never attends to a response token.

Positions are what the plain path would use: for a Qwen-VL prompt with images, the 3D (mrope)
positions of `get_rope_index`, and for the response tokens the text positions that follow
(`next_position`, the same in all three sections); for text prompts, the count of real tokens.

`sample` replaces `model.generate` for the engine's plain sampling (softmax(logits / T) with
nucleus top-p, suppressed ids, stop at EOS), with HF's order of operations and the same draws
from torch's global RNG, so a run stays deterministic and resumable.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class PromptPass:
    """The distinct prompts after one forward: what their responses continue from."""

    cache: Any  # the model's key/value cache, batch = distinct prompts
    last_logits: torch.Tensor  # [D, V] the logits at each prompt's last position (predicting response token 0)
    attention_mask: torch.Tensor  # [D, L] long, left-padded prompts
    next_position: torch.Tensor  # [D] long, the position of each prompt's first response token


def prompt_pass(policy: Any, batch: dict[str, Any]) -> PromptPass:
    """Forward the (left-padded, distinct) prompts of `batch` once, keeping the cache (grad as the caller's mode)."""
    inputs = dict(batch)
    inputs["position_ids"], next_position = prompt_positions(policy, inputs)
    out = policy.model(**inputs, use_cache=True, logits_to_keep=1)
    if out.past_key_values is None:
        raise RuntimeError("model.prefix_sharing needs the model's key/value cache, and the forward returned none "
                           "(gradient checkpointing turns it off); set model.prefix_sharing: false")
    return PromptPass(out.past_key_values, out.logits[:, -1], inputs["attention_mask"], next_position)


def prompt_positions(policy: Any, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions for a prompt forward and each prompt's next text position [D]."""
    mask = inputs["attention_mask"]
    has_images = "image_grid_thw" in inputs or "video_grid_thw" in inputs
    if policy._uses_mrope and has_images:
        rope = policy._base_model().model.get_rope_index
        accepted = inspect.signature(rope).parameters
        kwargs = {k: inputs[k] for k in ("mm_token_type_ids", "image_grid_thw", "video_grid_thw") if k in inputs
                  and k in accepted}
        positions, _ = rope(inputs["input_ids"], attention_mask=mask, **kwargs)  # [3, D, L]
        real = mask.bool().unsqueeze(0).expand_as(positions)
        next_position = positions.masked_fill(~real, -1).amax(dim=(0, 2)) + 1  # text continues after the max
        return positions, next_position
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # real tokens counted, as generate does
    return positions, mask.sum(-1)


def continue_rows(policy: Any, cache: Any, tokens: torch.Tensor, mask: torch.Tensor,
                  first_position: torch.Tensor) -> torch.Tensor:
    """Logits [n, t, V] after `tokens` [n, t], whose past (prompt and earlier tokens) is in `cache`.

    `mask` [n, past + t] covers the past and the tokens; `first_position` [n] is the first token's position.
    """
    positions = first_position.unsqueeze(1) + torch.arange(tokens.shape[1], device=tokens.device)  # [n, t]
    out = policy.model(input_ids=tokens, attention_mask=mask, position_ids=positions, past_key_values=cache,
                       use_cache=True)
    return out.logits


def expanded_cache(state: PromptPass, prompt_of_row: torch.Tensor) -> Any:
    """A cache with one copy of its prompt's keys/values per row (the prompt pass's own cache is consumed)."""
    state.cache.reorder_cache(prompt_of_row)
    return state.cache


def response_logits(policy: Any, batch: dict[str, Any], prompt_of_row: torch.Tensor, response: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
    """Logits [n, W, V] predicting each response token j (from position j - 1), prompts run once.

    Args:
        batch: the distinct prompts' model inputs (`Policy._batch`), D rows.
        prompt_of_row: [n] long, which of the D prompts each row answers.
        response: [n, W] long response ids (pad where mask is 0); mask: [n, W] long.
    """
    state = prompt_pass(policy, batch)
    first = state.last_logits[prompt_of_row].unsqueeze(1)  # [n, 1, V] predicts response token 0
    if response.shape[1] == 1:
        return first
    cache = expanded_cache(state, prompt_of_row)
    full_mask = torch.cat([state.attention_mask[prompt_of_row], mask[:, :-1]], dim=1)
    rest = continue_rows(policy, cache, response[:, :-1], full_mask, state.next_position[prompt_of_row])
    return torch.cat([first, rest], dim=1)


@torch.no_grad()
def sample(policy: Any, batch: dict[str, Any], prompt_of_row: torch.Tensor, *, max_new_tokens: int,
           temperature: float, top_p: float, greedy: bool) -> torch.Tensor:
    """Response ids [N, T] (T <= max_new_tokens; after a row's EOS, pad) for rows answering prompt_of_row.

    The same steps as HF's sampler: suppressed ids to -inf, then logits / temperature, then the
    top-p filter, then one `torch.multinomial` draw per step over all rows (argmax when greedy).
    """
    state = prompt_pass(policy, batch)
    logits = state.last_logits[prompt_of_row].float()  # [N, V]
    cache = expanded_cache(state, prompt_of_row)
    n = int(prompt_of_row.numel())
    eos = torch.tensor(policy.eos_token_ids, device=logits.device)
    suppressed = torch.tensor(policy.suppressed_token_ids, dtype=torch.long, device=logits.device)
    done = torch.zeros(n, dtype=torch.bool, device=logits.device)
    mask = state.attention_mask[prompt_of_row]  # grows by one column per sampled token
    position = state.next_position[prompt_of_row]
    new_column = torch.ones(n, 1, dtype=mask.dtype, device=mask.device)
    steps: list[torch.Tensor] = []
    for t in range(max_new_tokens):
        token = next_token(logits, suppressed, temperature, top_p, greedy)
        token = token.masked_fill(done, policy.pad_token_id)
        steps.append(token)
        done |= torch.isin(token, eos)
        if bool(done.all()) or t + 1 == max_new_tokens:
            break
        mask = torch.cat([mask, new_column], dim=1)
        logits = continue_rows(policy, cache, token.unsqueeze(1), mask, position + t)[:, -1].float()
    return torch.stack(steps, dim=1)


def next_token(logits: torch.Tensor, suppressed: torch.Tensor, temperature: float, top_p: float,
               greedy: bool) -> torch.Tensor:
    """One token per row: HF's SuppressTokens -> Temperature -> TopP -> softmax -> multinomial (or argmax)."""
    if suppressed.numel():
        logits = logits.index_fill(-1, suppressed, -float("inf"))
    if greedy:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove = cumulative <= (1 - top_p)
        remove[..., -1:] = False  # always keep the most likely token
        logits = logits.masked_fill(remove.scatter(-1, order, remove), -float("inf"))
    return torch.multinomial(logits.softmax(-1), num_samples=1).squeeze(1)
