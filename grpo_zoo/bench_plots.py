"""The PNG plots of a `grpo-zoo bench` report.

Figures are drawn on matplotlib's Agg canvas through `matplotlib.figure.Figure`, never pyplot,
so no display and no global backend switch are needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from grpo_zoo.bench_report import HISTOGRAM_PLOTS, TrialResult, bootstrap_ci

if TYPE_CHECKING:
    from grpo_zoo.bench import BenchConfig

MAX_HISTOGRAM_STEPS = 5  # histograms drawn per panel (evenly spaced over the recorded steps)
BAND_RESAMPLES = 1999  # bootstrap resamples per point of a CI band: a band needs less precision than a table


def write_plots(plot_dir: Path, results: list[TrialResult], cfg: BenchConfig) -> dict[str, str]:
    """Draw every plot the results allow; returns title -> file name (relative to plot_dir)."""
    if not results:
        return {}
    plot_dir.mkdir(parents=True, exist_ok=True)
    recipes = [name for name in cfg.recipes if any(r.recipe == name for r in results)]
    plots = {
        f"held-out {cfg.metric} vs step": accuracy_plot(plot_dir / "accuracy_vs_step.png", results, recipes, cfg),
        "effective gradient ratio vs step": egr_plot(plot_dir / "effective_gradient_ratio.png", results, recipes),
    }
    for key, (name, label, value_range) in HISTOGRAM_PLOTS.items():
        drawn = histogram_plot(plot_dir / name, results, recipes, key, label, value_range)
        if drawn:
            plots[f"{label} over training"] = drawn
    return plots


def new_axes(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (7.0, 4.2)):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def colour(recipes: list[str], name: str):
    from matplotlib import colormaps

    return colormaps["tab10"](recipes.index(name) % 10)


def accuracy_plot(path: Path, results: list[TrialResult], recipes: list[str], cfg: BenchConfig) -> str:
    """Mean over seeds of the held-out metric at each eval step, with a bootstrap CI band where >= 2 seeds."""
    fig, axes = new_axes()
    ax = axes[0, 0]
    for name in recipes:
        curves = [dict(zip(r.eval_steps, r.eval_values)) for r in results if r.recipe == name]
        steps = sorted({s for c in curves for s in c})
        values = [[c[s] for c in curves if s in c] for s in steps]
        cis = [bootstrap_ci(v, cfg.confidence, BAND_RESAMPLES) for v in values]
        ax.plot(steps, [np.mean(v) for v in values], marker="o", ms=3, color=colour(recipes, name),
                label=f"{name} (n={len(curves)})")
        ax.fill_between(steps, [c[0] if c else np.nan for c in cis], [c[1] if c else np.nan for c in cis],
                        color=colour(recipes, name), alpha=0.15, linewidth=0)
    ax.axhline(cfg.target, color="grey", linestyle="--", linewidth=1, label=f"target {cfg.target}")
    ax.set(xlabel="training step", ylabel=cfg.metric, title=f"{cfg.metric}: mean over seeds, {cfg.confidence:.0%} CI")
    ax.legend(fontsize=7, ncols=2)
    integer_steps(ax)
    fig.savefig(path, dpi=110)
    return path.name


def egr_plot(path: Path, results: list[TrialResult], recipes: list[str]) -> str:
    """Effective gradient ratio (share of groups with a non-zero reward spread) per step, mean over seeds."""
    fig, axes = new_axes()
    ax = axes[0, 0]
    for name in recipes:
        per_step: dict[int, list[float]] = {}
        for r in results:
            if r.recipe == name:
                for s, v in zip(r.egr_steps, r.egr):
                    per_step.setdefault(s, []).append(v)
        steps = sorted(per_step)
        mean = np.array([np.mean(per_step[s]) for s in steps])
        window = max(1, len(steps) // 40)  # light smoothing so long runs stay readable
        if window > 1:
            mean = np.convolve(mean, np.ones(window) / window, mode="same")
        ax.plot(steps, mean, color=colour(recipes, name), label=name, linewidth=1.2)
    ax.set(xlabel="training step", ylabel="effective gradient ratio", ylim=(-0.02, 1.02),
           title="groups with a non-zero reward spread (mean over seeds)")
    ax.legend(fontsize=7, ncols=2)
    integer_steps(ax)
    fig.savefig(path, dpi=110)
    return path.name


def histogram_plot(path: Path, results: list[TrialResult], recipes: list[str], key: str, label: str,
                   value_range: tuple[float, float]) -> str | None:
    """One panel per recipe that recorded `key`: its distribution at a few steps, seeds pooled; None if none did."""
    from matplotlib import colormaps

    having = [n for n in recipes if any(key in r.histograms for r in results if r.recipe == n)]
    if not having:
        return None
    ncols = min(3, len(having))
    fig, axes = new_axes(ncols, -(-len(having) // ncols), size=(5.0, 3.4))
    for ax in axes.flat[len(having):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, having):
        pooled: dict[int, list[float]] = {}
        for r in results:
            if r.recipe == name:
                for step, values in r.histograms.get(key, []):
                    pooled.setdefault(step, []).extend(values)
        steps = sorted(pooled)
        chosen = [steps[i] for i in sorted({round(i) for i in np.linspace(0, len(steps) - 1, MAX_HISTOGRAM_STEPS)})]
        lo = min(value_range[0], *(min(pooled[s], default=value_range[0]) for s in chosen))
        hi = max(value_range[1], *(max(pooled[s], default=value_range[1]) for s in chosen))
        for i, step in enumerate(chosen):
            shade = colormaps["viridis"](i / max(1, len(chosen) - 1))
            ax.hist(pooled[step], bins=16, range=(lo, hi), density=True, histtype="step", color=shade,
                    linewidth=1.4, label=f"step {step}")
        ax.set(title=name, xlabel=label, ylabel="density")
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
    return path.name
