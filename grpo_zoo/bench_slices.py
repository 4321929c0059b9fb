"""Where an arm's gain is made: the bench metric per slice of the held-out set (eval.by columns).

A trial whose recipe sets `eval.by: [tier]` logs `eval/tier=<value>/pass@1` at every eval. The
report's table per column gives each value's metric at the start (the shared base, step 0) and at
each arm's last eval, means over seeds, so two arms with the same overall score can be told apart
by which questions they gained or lost (on the testbed: the crowded scenes of tier 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo_zoo.slice_keys import group_slices


def slice_values(row: dict[str, Any], metric: str) -> dict[tuple[str, str], float]:
    """{(column, value): metric} of one eval record, in the record's value order; {} when its recipe set no eval.by."""
    name = metric.removeprefix("eval/")
    return {(column, value): float(x) for column, by_name in group_slices(row).items()
            for value, x in by_name.get(name, {}).items() if x is not None}


@dataclass
class SliceRow:
    """One arm's (or the start's) metric per value of one column, means over seeds."""

    recipe: str  # "start" for the step-0 evals, which every arm shares when they start from one base
    column: str
    seeds: int
    values: dict[str, float]


def slice_rows(per_trial: list[tuple[str, dict[tuple[str, str], float], dict[tuple[str, str], float]]]
               ) -> list[SliceRow]:
    """(recipe, first-eval slices, last-eval slices) per trial -> a start row and a row per recipe, per column."""
    columns = sorted({c for _, first, last in per_trial for c, _ in (*first, *last)})
    out = []
    for column in columns:
        groups: dict[str, list[dict[str, float]]] = {}
        starts = [{v: x for (c, v), x in first.items() if c == column} for _, first, _ in per_trial]
        for recipe, _, last in per_trial:
            finals = {v: x for (c, v), x in last.items() if c == column}
            if finals:
                groups.setdefault(recipe, []).append(finals)
        rows = [SliceRow("start", column, sum(bool(s) for s in starts), _means([s for s in starts if s]))]
        rows += [SliceRow(recipe, column, len(trials), _means(trials)) for recipe, trials in groups.items()]
        out += [r for r in rows if r.values]
    return out


def slice_lines(rows: list[SliceRow], metric: str, fmt) -> list[str]:
    """The report's section; [] when no trial logged slices."""
    if not rows:
        return []
    lines = ["", "## Where the gain is: the main metric per slice of the held-out set", "",
             f"`{metric}` per value of each `eval.by` column: at the start (the step-0 evals) and at each arm's "
             "last eval, means over seeds; the change from the start in brackets."]
    for column in dict.fromkeys(r.column for r in rows):
        block = [r for r in rows if r.column == column]
        values = list(dict.fromkeys(v for r in block for v in r.values))  # as the eval logged them: value order
        start = next((r for r in block if r.recipe == "start"), None)
        lines += ["", f"| {column} | seeds | " + " | ".join(values) + " |", "|---|---|" + "---|" * len(values)]
        for r in block:
            cells = []
            for v in values:
                x = r.values.get(v, math.nan)
                base = start.values.get(v, math.nan) if start is not None and r is not start else math.nan
                cells.append(fmt(x) + ("" if math.isnan(base) or math.isnan(x) else f" ({x - base:+.3f})"))
            lines.append(f"| {r.recipe} | {r.seeds} | " + " | ".join(cells) + " |")
    return lines


def _means(trials: list[dict[str, float]]) -> dict[str, float]:
    names = dict.fromkeys(v for t in trials for v in t)  # keeps the logged order
    return {v: float(np.mean([t[v] for t in trials if v in t])) for v in names}
