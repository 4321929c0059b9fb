"""Vectorised per-group statistics for advantage estimators.

Rows (responses) carry an arbitrary integer group id; `dense_ids` maps them to 0..K-1 and
every helper here reduces over rows with scatter operations, so the cost is O(N) (plus one
sort of the distinct run values) and there is no Python loop over groups. All helpers take
and return float64 so that huge (1e6) and tiny (1e-8) rewards keep their precision; callers
cast the final advantage back.

Conventions: `idx` [N] long in 0..K-1, `k` = number of groups, outputs are [K] unless noted.
A group with a single row has std 0 (Bessel's n - 1 would divide by zero).
"""

from __future__ import annotations

import torch


def take(per_group: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-group tensor [K] to rows [N] (index_select: ~5x faster than x[idx] on CPU)."""
    return per_group.index_select(0, idx)


def dense_ids(ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary ids [N] to dense labels 0..K-1 (sorted by id value) and return (labels, K).

    Same result as `torch.unique(ids, return_inverse=True)`, but rows are first compressed
    into runs of equal consecutive ids: rollout batches are ordered prompt by prompt, so the
    sort then runs over K run values instead of N rows (about 8x less work for G = 8).
    """
    ids = ids.reshape(-1)
    n = ids.numel()
    if n == 0:
        return ids.new_zeros(0, dtype=torch.long), 0
    starts = torch.ones(n, dtype=torch.bool, device=ids.device)  # [N] True where a run begins
    starts[1:] = ids[1:] != ids[:-1]
    run_of_row = torch.cumsum(starts.long(), 0) - 1  # [N] run index of each row
    run_values = ids[starts]  # [R]
    if bool((run_values[1:] > run_values[:-1]).all()):  # sorted ids: the run index already is the label
        return run_of_row, int(run_values.numel())
    uniq, run_label = torch.unique(run_values, return_inverse=True)  # [K], [R]
    return take(run_label, run_of_row), int(uniq.numel())


def group_count(idx: torch.Tensor, k: int) -> torch.Tensor:
    """Rows per group, float64 [K]."""
    return torch.bincount(idx, minlength=k).to(torch.float64)


def group_sum(values: torch.Tensor, idx: torch.Tensor, k: int) -> torch.Tensor:
    """Sum of `values` [N] per group, float64 [K]."""
    out = torch.zeros(k, dtype=torch.float64, device=values.device)
    return out.index_add_(0, idx, values.to(torch.float64))


def group_mean(values: torch.Tensor, idx: torch.Tensor, k: int, count: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of `values` [N] per group, float64 [K]; an empty group (no rows) gets 0."""
    count = group_count(idx, k) if count is None else count
    return group_sum(values, idx, k) / count.clamp_min(1.0)


def group_mean_exact(
    values: torch.Tensor, idx: torch.Tensor, k: int, count: torch.Tensor | None = None
) -> torch.Tensor:
    """Group mean computed around the group minimum, float64 [K].

    lo + mean(v - lo) equals the plain mean up to rounding, but a constant group gets exactly
    its value back (v - lo is exactly 0), so r - mean is exactly 0 there in any dtype and a
    later division by (std + eps) cannot blow an ulp up into a visible advantage.
    """
    lo = group_min(values, idx, k)  # [K]
    return lo + group_mean(values.to(torch.float64) - take(lo, idx), idx, k, count)


def group_std(
    values: torch.Tensor,
    idx: torch.Tensor,
    k: int,
    mean: torch.Tensor | None = None,
    count: torch.Tensor | None = None,
) -> torch.Tensor:
    """Unbiased (Bessel, n - 1) std of `values` [N] per group, float64 [K]; groups of < 2 rows get 0.

    Two-pass (centre first, then square) so that a group of equal huge values gives exactly 0.
    """
    count = group_count(idx, k) if count is None else count
    mean = group_mean(values, idx, k, count) if mean is None else mean
    centred = values.to(torch.float64) - take(mean, idx)  # [N]
    sq = group_sum(centred * centred, idx, k)  # [K]
    var = torch.where(count > 1, sq / (count - 1).clamp_min(1.0), torch.zeros_like(sq))
    return var.sqrt()


def group_max(values: torch.Tensor, idx: torch.Tensor, k: int) -> torch.Tensor:
    """Max of `values` [N] per group, float64 [K]; an empty group gets -inf."""
    out = torch.full((k,), float("-inf"), dtype=torch.float64, device=values.device)
    return out.scatter_reduce_(0, idx, values.to(torch.float64), reduce="amax", include_self=True)


def group_min(values: torch.Tensor, idx: torch.Tensor, k: int) -> torch.Tensor:
    """Min of `values` [N] per group, float64 [K]; an empty group gets +inf."""
    out = torch.full((k,), float("inf"), dtype=torch.float64, device=values.device)
    return out.scatter_reduce_(0, idx, values.to(torch.float64), reduce="amin", include_self=True)


def group_first_argmax(values: torch.Tensor, idx: torch.Tensor, k: int) -> torch.Tensor:
    """Row index [K] long of each group's maximum; ties go to the first row in row order."""
    n = values.numel()
    vmax = group_max(values, idx, k)  # [K]
    is_max = values.to(torch.float64) == take(vmax, idx)  # [N]
    rows = torch.arange(n, device=values.device)
    candidate = torch.where(is_max, rows, torch.full_like(rows, n))  # non-max rows can never win
    out = torch.full((k,), n, dtype=torch.long, device=values.device)
    return out.scatter_reduce_(0, idx, candidate, reduce="amin", include_self=True)


def group_second_max(
    values: torch.Tensor, idx: torch.Tensor, k: int, first: torch.Tensor | None = None
) -> torch.Tensor:
    """Largest value per group once the (first) best row is removed, float64 [K].

    A tie for the best gives second max == max. A group of one row gets -inf.
    """
    first = group_first_argmax(values, idx, k) if first is None else first
    masked = values.to(torch.float64).clone()  # [N]
    masked[first] = float("-inf")
    return group_max(masked, idx, k)
