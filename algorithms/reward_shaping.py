"""Reward-side shaping that a loss alone cannot express: DAPO's overlong penalty."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int) -> torch.Tensor:
    """DAPO soft overlong punishment (arXiv 2503.14476, eq. 13), added to the reward.

    With L_max = max_len (the response limit) and L_buf = buffer:
        penalty = min(-(len - (L_max - L_buf)) / L_buf, 0), floored at -1.
    A response up to L_max - L_buf tokens long is not penalised; inside the last L_buf tokens
    the penalty falls linearly from 0 to -1 at len = L_max, so truncation is discouraged
    gradually rather than by a cliff. The -1 floor is the paper's value for len > L_max, which
    a sampler that stops at L_max never produces.

    lengths: [N] response lengths in tokens (int or float). Returns [N] float penalties <= 0.
    buffer = 0 turns shaping off (all zeros), matching reward.overlong_buffer = 0.
    Example: L_max = 10, L_buf = 4 -> len 6: 0; len 7: -0.25; len 10: -1.
    """
    if lengths.dim() != 1:
        raise ValueError(f"overlong_penalty: lengths must be 1-D [N], got shape {tuple(lengths.shape)}")
    if max_len <= 0:
        raise ValueError(f"overlong_penalty: max_len (the response limit L_max) must be > 0, got {max_len}")
    if not 0 <= buffer <= max_len:
        raise ValueError(
            f"overlong_penalty: buffer (reward.overlong_buffer) must be in [0, max_len = {max_len}], got {buffer}"
        )
    dtype = lengths.dtype if lengths.is_floating_point() else torch.float32
    lengths = lengths.to(dtype)
    if buffer == 0:
        return torch.zeros_like(lengths)
    excess = lengths - (max_len - buffer)  # [N], > 0 inside the buffer zone
    return (-excess / buffer).clamp(min=-1.0, max=0.0)
