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
        f"final held-out {cfg.metric} per recipe": finals_plot(plot_dir / "final_accuracy.png", results, recipes, cfg),
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


def finals_plot(path: Path, results: list[TrialResult], recipes: list[str], cfg: BenchConfig) -> str:
    """Each recipe's final metric: every seed as a dot, the mean with its bootstrap CI as a bar."""
    fig, axes = new_axes(size=(7.0, 0.9 + 0.42 * len(recipes)))
    ax = axes[0, 0]
    for row, name in enumerate(recipes):
        finals = [r.final for r in results if r.recipe == name and r.final is not None]
        if not finals:
            continue
        y = len(recipes) - 1 - row
        mean, ci = float(np.mean(finals)), bootstrap_ci(finals, cfg.confidence, BAND_RESAMPLES)
        ax.scatter(finals, [y] * len(finals), s=14, color=colour(recipes, name), alpha=0.55, linewidths=0)
        bar = None if ci is None else [[mean - ci[0]], [ci[1] - mean]]
        ax.errorbar([mean], [y], xerr=bar, fmt="D", ms=6, color=colour(recipes, name), capsize=4)
    base = [r.final for r in results if r.recipe == cfg.baseline and r.final is not None]
    if base:
        ax.axvline(float(np.mean(base)), color="grey", linestyle=":", linewidth=1, label=f"{cfg.baseline} mean")
        ax.legend(fontsize=7, loc="lower right")
    ax.set_yticks(range(len(recipes)), [f"{n} (n={sum(r.recipe == n for r in results)})" for n in reversed(recipes)])
    ax.set(xlabel=f"final {cfg.metric}", title=f"seeds (dots), mean and {cfg.confidence:.0%} bootstrap CI")
    fig.savefig(path, dpi=110)
    return path.name


def accuracy_plot(path: Path, results: list[TrialResult], recipes: list[str], cfg: BenchConfig) -> str:
    """The held-out metric against training steps and against CPU seconds (the budgeted quantity).

    Solid lines and bootstrap CI bands (>= 2 seeds) join the mean over seeds at the evals every
    seed of a recipe ran; budget-ended trials stop at different steps, so a seed's own last eval
    is shown apart, as the mean final value (with its CI bar) at the seeds' mean final step or
    CPU seconds, joined by a dashed line. Averaging whichever seeds happened to reach a step
    would make a recipe's curve jump as its seeds drop out.
    """
    fig, axes = new_axes(2, size=(6.0, 4.4))
    for ax, on_cpu in ((axes[0, 0], False), (axes[0, 1], True)):
        for name in recipes:
            trials = [r for r in results if r.recipe == name and r.eval_steps]
            if trials:
                draw_curve(ax, trials, on_cpu, colour(recipes, name), f"{name} (n={len(trials)})", cfg.confidence)
        ax.axhline(cfg.target, color="grey", linestyle="--", linewidth=1, label=f"target {cfg.target}")
        ax.set(xlabel="CPU seconds (the budgeted quantity)" if on_cpu else "training step", ylabel=cfg.metric)
        if not on_cpu:
            integer_steps(ax)
    axes[0, 0].legend(fontsize=7, ncols=2)
    fig.suptitle(f"{cfg.metric}: mean over seeds, {cfg.confidence:.0%} bootstrap CI; "
                 "separate markers: each seed's last eval (mean)")
    fig.savefig(path, dpi=110)
    return path.name


def draw_curve(ax, trials: list[TrialResult], on_cpu: bool, color, label: str, confidence: float) -> None:
    """One recipe's curve on `ax`: the evals all its seeds share, then the mean of their last evals."""
    curves = [{s: (v, c) for s, v, c in zip(r.eval_steps, r.eval_values, r.eval_cpu)} for r in trials]
    common = sorted(set.intersection(*(set(c) for c in curves)))
    xs = [float(np.mean([c[s][1] for c in curves])) if on_cpu else s for s in common]
    values = [[c[s][0] for c in curves] for s in common]
    cis = [bootstrap_ci(v, confidence, BAND_RESAMPLES) for v in values]
    ax.plot(xs, [np.mean(v) for v in values], marker="o", ms=3, color=color, label=label)
    ax.fill_between(xs, [c[0] if c else np.nan for c in cis], [c[1] if c else np.nan for c in cis],
                    color=color, alpha=0.15, linewidth=0)
    finals = [r.eval_values[-1] for r in trials]
    end_x = float(np.mean([r.eval_cpu[-1] if on_cpu else r.eval_steps[-1] for r in trials]))
    if xs and np.isclose(end_x, xs[-1]):
        return  # every seed's last eval is the last shared one: already drawn
    end_y = float(np.mean(finals))
    ci = bootstrap_ci(finals, confidence, BAND_RESAMPLES)
    bar = None if ci is None else [[end_y - ci[0]], [ci[1] - end_y]]
    if xs:
        ax.plot([xs[-1], end_x], [np.mean(values[-1]), end_y], linestyle="--", linewidth=1, color=color)
    ax.errorbar([end_x], [end_y], yerr=bar, fmt="D", ms=4, color=color, capsize=3, linewidth=1)


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
