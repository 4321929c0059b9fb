"""The metric name of an eval.by slice, `eval/<column>=<value>/<metric>`: written by the eval, read by the
trainer's console lines and the bench report. Kept free of torch so the bench's report imports stay light."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

SLICE_KEY = re.compile(r"^eval/([^/=]+)=([^/]*)/([^/]+)$")


def slice_key(column: str, value: str, name: str) -> str:
    return f"eval/{column}={value}/{name}"


def parse_slice_key(key: str) -> tuple[str, str, str] | None:
    """(column, value, metric name) of a `slice_key`; None for any other key."""
    match = SLICE_KEY.match(key)
    return match.group(1, 2, 3) if match else None


def group_slices(metrics: Mapping[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """column -> metric name -> {value: figure} for every slice key in `metrics`, in their logged order."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for key, figure in metrics.items():
        parsed = parse_slice_key(key)
        if parsed:
            column, value, name = parsed
            out.setdefault(column, {}).setdefault(name, {})[value] = figure
    return out
