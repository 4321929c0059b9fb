"""Where an arm's gradient signal comes from: the group outcomes of each kind of prompt it trained on.

The trainer logs `groups/<kind>/{effective_gradient_ratio,all_correct,all_wrong}` on every step
whose batch mixes kinds of prompt (originals with DIVA's hinted or perturbed variants, say), and
`prompts/share_<kind>` always. A bench arm's table row per kind then says how much of its batch
that kind took and how often its groups carried a gradient, so a variant that is almost always
solved (or never) shows as batch spent on no signal.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

STATS = ("effective_gradient_ratio", "all_correct", "all_wrong")
KIND_KEY = re.compile(r"^groups/([^/]+)/(" + "|".join(STATS) + r")$")


@dataclass
class KindSignal:
    """One arm's group outcomes on one kind of prompt, means over steps, then over seeds."""

    recipe: str
    kind: str
    seeds: int
    prompt_share: float  # share of the step's prompts of this kind
    effective_gradient_ratio: float  # share of this kind's groups whose rewards differ
    all_correct: float
    all_wrong: float
    signal_share: float  # this kind's share of the step's groups that carry a gradient


def kind_means(rows: dict[int, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """{kind: {stat: mean over the steps that logged it, "prompt_share": ...}} of one trial's records."""
    values: dict[str, dict[str, list[float]]] = {}
    for row in rows.values():
        for key, value in row.items():
            match = KIND_KEY.match(key)
            if match and value is not None:
                values.setdefault(match.group(1), {}).setdefault(match.group(2), []).append(float(value))
    out = {kind: {stat: float(np.mean(v)) for stat, v in stats.items()} for kind, stats in values.items()}
    for kind, stats in out.items():
        shares = [r[f"prompts/share_{kind}"] for r in rows.values() if r.get(f"prompts/share_{kind}") is not None]
        stats["prompt_share"] = float(np.mean(shares)) if shares else math.nan
    return out


def signal_by_kind(per_trial: list[tuple[str, dict[str, dict[str, float]]]]) -> list[KindSignal]:
    """Average (recipe, kind_means) over each recipe's seeds; recipes in first-seen order, kinds by name."""
    grouped: dict[str, list[dict[str, dict[str, float]]]] = {}
    for recipe, kinds in per_trial:
        if kinds:
            grouped.setdefault(recipe, []).append(kinds)
    out = []
    for recipe, trials in grouped.items():
        names = sorted({kind for kinds in trials for kind in kinds})
        mean = {kind: {stat: _mean([t[kind].get(stat, math.nan) for t in trials if kind in t])
                       for stat in (*STATS, "prompt_share")} for kind in names}
        carrying = {kind: mean[kind]["prompt_share"] * mean[kind]["effective_gradient_ratio"] for kind in names}
        total = sum(v for v in carrying.values() if not math.isnan(v))
        for kind in names:
            m = mean[kind]
            out.append(KindSignal(recipe, kind, sum(kind in t for t in trials), m["prompt_share"],
                                  m["effective_gradient_ratio"], m["all_correct"], m["all_wrong"],
                                  carrying[kind] / total if total > 0 else math.nan))
    return out


def signal_lines(signals: list[KindSignal], fmt) -> list[str]:
    """The report's section; [] when no arm mixed kinds of prompt."""
    if not signals:
        return []
    lines = ["", "## Gradient signal by kind of prompt", "",
             "Arms whose batches mix kinds of prompt (originals and variants). Per kind: its share of the "
             "step's prompts, the share of its groups whose rewards differ (they carry a gradient), its "
             "all-correct and all-wrong shares, and its share of the step's gradient-carrying groups "
             "(prompt share x effective gradient ratio, normalised over kinds). Means over steps, then seeds.",
             "", "| recipe | kind | seeds | prompt share | eff. grad ratio | all-correct | all-wrong | "
             "share of signal |", "|---|---|---|---|---|---|---|---|"]
    for s in signals:
        lines.append(f"| {s.recipe} | {s.kind} | {s.seeds} | {fmt(s.prompt_share)} | {fmt(s.effective_gradient_ratio)} "
                     f"| {fmt(s.all_correct)} | {fmt(s.all_wrong)} | {fmt(s.signal_share)} |")
    return lines


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan
