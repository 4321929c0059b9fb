"""Statistics, plots and report.md of a `grpo-zoo bench` run, read back from its trials' JSONL files.

Per recipe: the final held-out metric (mean and a percentile-bootstrap CI over seeds), steps / CPU
seconds / wall-clock seconds to the target (over the seeds that reached it, with how many did not),
the mean effective gradient ratio, the shares of all-correct and all-wrong groups, responses per
step and generated tokens per second, and a Welch (or Mann-Whitney) test against the baseline.
Wall-clock is training time (the sum of time/step_s); held-out evals are left out of it.

The paper-style speed-up ("DIVA-GRPO reaches GRPO's accuracy in 2.55x fewer steps") is in `speedups`:
the baseline's mean final metric is the bar, and each recipe's steps (and CPU / wall seconds) to that
bar are divided into the baseline's own, with a two-sample bootstrap CI of that ratio of means.

The "Starting base" section restates OUT/audit/audit.json (`grpo-zoo audit` of the base the
trials start from, run by grpo_zoo.bench): group shares, pass@1, each variant kind's verdict and
the revisits, so a head-to-head is read against the regime it was run in.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from grpo_zoo.bench_signal import kind_means, signal_by_kind, signal_lines
from grpo_zoo.bench_slices import slice_lines, slice_rows, slice_values

if TYPE_CHECKING:
    from grpo_zoo.bench import BenchConfig, Trial

# Selector histograms plotted over time: key in histograms.jsonl -> (file, axis label, value range).
HISTOGRAM_PLOTS = {
    "diva/difficulty": ("diva_difficulty.png", "DIVA difficulty D of the questions seen", (1.0, 9.0)),
    "vade/posterior_mean": ("vade_posterior_mean.png", "VADE posterior mean of the success rate", (0.0, 1.0)),
}


@dataclass
class TrialResult:
    """What one trial's metrics.jsonl (and histograms.jsonl) says; lists follow steps in order."""

    recipe: str
    seed: int
    steps: int = 0  # training steps run
    cpu_s: float = 0.0  # process CPU seconds at the last step (the budgeted quantity)
    wall_s: float = 0.0  # sum of time/step_s: training wall-clock, evals excluded
    eval_steps: list[int] = field(default_factory=list)
    eval_values: list[float] = field(default_factory=list)  # the bench metric at each eval
    eval_cpu: list[float] = field(default_factory=list)
    eval_wall: list[float] = field(default_factory=list)
    final: float | None = None  # the metric at the last eval
    final_greedy: float | None = None
    egr_steps: list[int] = field(default_factory=list)
    egr: list[float] = field(default_factory=list)  # effective gradient ratio per step
    all_correct: float = math.nan  # mean share of all-correct groups per step
    all_wrong: float = math.nan
    responses_per_step: float = math.nan  # generated responses (dynamic sampling counts its refills)
    tokens_per_s: float = math.nan  # generated tokens (responses x mean kept length) per training second
    histograms: dict[str, list[tuple[int, list[float]]]] = field(default_factory=dict)
    by_kind: dict[str, dict[str, float]] = field(default_factory=dict)  # bench_signal.kind_means: per prompt kind
    first_slices: dict[tuple[str, str], float] = field(default_factory=dict)  # bench_slices: (column, value) ->
    final_slices: dict[tuple[str, str], float] = field(default_factory=dict)  # metric at the first / last eval

    def to_target(self, target: float) -> tuple[int, float, float] | None:
        """(step, CPU s, wall s) of the first eval reaching target; None when never reached."""
        for step, value, cpu, wall in zip(self.eval_steps, self.eval_values, self.eval_cpu, self.eval_wall):
            if value >= target:
                return step, cpu, wall
        return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_trial(run_dir: Path, recipe: str, seed: int, metric: str = "eval/pass@1") -> TrialResult | None:
    """Parse a trial folder; None when it has no metrics yet. Records of one step are merged (last wins)."""
    rows: dict[int, dict[str, Any]] = {}
    for record in read_jsonl(run_dir / "metrics.jsonl"):
        rows.setdefault(int(record["step"]), {}).update(record)
    if not rows:
        return None
    out = TrialResult(recipe, seed)
    wall = cpu = 0.0
    generated: list[float] = []
    tokens = 0.0
    for step in sorted(rows):
        row = rows[step]
        if row.get("time/step_s") is not None:
            wall += row["time/step_s"]
            cpu = row.get("time/cpu_s") or cpu
            out.steps = step
            n = row.get("rollout/generated", row.get("rollout/responses")) or 0.0
            generated.append(n)
            tokens += n * (row.get("response/length_mean") or 0.0)
        if row.get(metric) is not None:
            out.eval_steps.append(step)
            out.eval_values.append(float(row[metric]))
            out.eval_cpu.append(cpu)
            out.eval_wall.append(wall)
            out.final, out.final_greedy = float(row[metric]), row.get("eval/greedy_accuracy")
            out.final_slices = slice_values(row, metric)
            if step == 0:  # the base every trial starts from (eval.at_start)
                out.first_slices = out.final_slices
        if row.get("groups/effective_gradient_ratio") is not None:
            out.egr_steps.append(step)
            out.egr.append(float(row["groups/effective_gradient_ratio"]))
    out.cpu_s, out.wall_s = cpu, wall
    out.all_correct = mean_of(rows, "groups/all_correct")
    out.all_wrong = mean_of(rows, "groups/all_wrong")
    out.responses_per_step = float(np.mean(generated)) if generated else math.nan
    out.tokens_per_s = tokens / wall if wall > 0 else math.nan
    out.by_kind = kind_means(rows)
    by_step: dict[int, dict[str, Any]] = {}
    for record in read_jsonl(run_dir / "histograms.jsonl"):  # a resumed run may repeat steps: last wins
        by_step[int(record.pop("step"))] = record
    for step in sorted(by_step):
        for key, values in by_step[step].items():
            out.histograms.setdefault(key, []).append((step, values))
    return out


def mean_of(rows: dict[int, dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows.values() if r.get(key) is not None]
    return float(np.mean(values)) if values else math.nan


# --------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------


def bootstrap_ci(values: list[float], confidence: float = 0.95, resamples: int = 9999,
                 seed: int = 0) -> tuple[float, float] | None:
    """Percentile-bootstrap CI of the mean (scipy.stats.bootstrap); None below 2 values, (v, v) when all equal."""
    from scipy import stats

    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if len(x) < 2:
        return None
    if np.ptp(x) == 0:
        return float(x[0]), float(x[0])
    res = stats.bootstrap((x,), np.mean, confidence_level=confidence, n_resamples=resamples,
                          method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def compare(a: list[float], b: list[float], test: str = "welch") -> float | None:
    """Two-sided p-value of a vs b: Welch's t-test (unequal variances) or Mann-Whitney U; None if untestable."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0):
        return None  # one seed, or no variance anywhere: nothing to test against
    if test == "mann_whitney":
        p = stats.mannwhitneyu(a, b, alternative="two-sided").pvalue
    else:
        p = stats.ttest_ind(a, b, equal_var=False).pvalue
    return float(p) if math.isfinite(p) else None


def ratio_of_means(num: np.ndarray, den: np.ndarray) -> float:
    """mean(num) / mean(den) over the finite entries (nan = not reached); nan if a side is empty or den's mean is 0."""
    a, b = num[np.isfinite(num)], den[np.isfinite(den)]
    if not len(a) or not len(b) or b.mean() <= 0:
        return math.nan
    return float(a.mean() / b.mean())


def bootstrap_ratio_ci(num: list[float | None], den: list[float | None], confidence: float = 0.95,
                       resamples: int = 9999, seed: int = 0) -> tuple[float, float] | None:
    """Percentile-bootstrap CI of ratio_of_means(num, den); None/nan entries are seeds that never got there.

    The two sides are independent samples of seeds, so each is resampled on its own, not-reached seeds
    included (how many seeds reach the bar is part of the luck the interval shows); a resample where a
    side has no reached seed (or the denominator's mean is 0) has no ratio and is skipped. None when
    either side has fewer than 2 reached seeds, like bootstrap_ci below 2 values.
    """
    a = np.asarray([math.nan if v is None else v for v in num], dtype=np.float64)
    b = np.asarray([math.nan if v is None else v for v in den], dtype=np.float64)
    if np.isfinite(a).sum() < 2 or np.isfinite(b).sum() < 2:
        return None
    rng = np.random.default_rng(seed)

    def resampled_means(x: np.ndarray) -> np.ndarray:
        idx = rng.integers(0, len(x), size=(resamples, len(x)))
        reached = np.isfinite(x)[idx]
        sums = np.where(reached, x[idx], 0.0).sum(axis=1)
        counts = reached.sum(axis=1)
        return np.divide(sums, counts, out=np.full(resamples, math.nan), where=counts > 0)

    mean_a, mean_b = resampled_means(a), resampled_means(b)
    ok = np.isfinite(mean_a) & np.isfinite(mean_b) & (mean_b > 0)
    if not ok.any():
        return None
    ratios = mean_a[ok] / mean_b[ok]
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


@dataclass
class RecipeSummary:
    """One row of the report's main table; nan = not available, CIs are (low, high) or None."""

    recipe: str
    seeds: int  # finished trials
    final_mean: float
    final_ci: tuple[float, float] | None
    final_greedy_mean: float
    delta: float  # final_mean minus the baseline's
    p_value: float
    # Mean over the seeds both finished of (this recipe - the baseline at the same train.seed), and its CI.
    # A bench runs seed by seed, so a pair shares the machine's state (its speed buys the same steps).
    paired_delta: float
    paired_delta_ci: tuple[float, float] | None
    reached: int  # seeds whose held-out metric reached the target
    steps_to_target: float  # means over the seeds that reached it
    steps_to_target_ci: tuple[float, float] | None
    cpu_to_target: float
    cpu_to_target_ci: tuple[float, float] | None
    wall_to_target: float
    wall_to_target_ci: tuple[float, float] | None
    steps: float
    cpu_s: float
    effective_gradient_ratio: float  # mean over every step of every seed
    all_correct: float
    all_wrong: float
    responses_per_step: float
    tokens_per_s: float


def summarize(results: list[TrialResult], cfg: BenchConfig) -> list[RecipeSummary]:
    """One summary per recipe (in bench order), each tested against cfg.baseline."""
    def finals(name: str) -> list[float]:
        return [r.final for r in results if r.recipe == name and r.final is not None]

    def ci(values: list[float]) -> tuple[float, float] | None:
        return bootstrap_ci(values, cfg.confidence, cfg.bootstrap_resamples)

    base = finals(cfg.baseline)
    base_by_seed = {r.seed: r.final for r in results if r.recipe == cfg.baseline and r.final is not None}
    rows = []
    for name in cfg.recipes:
        trials = [r for r in results if r.recipe == name]
        final = finals(name)
        hits = [h for h in (r.to_target(cfg.target) for r in trials) if h is not None]
        steps, cpu, wall = ([h[i] for h in hits] for i in range(3))
        p_value = compare(final, base, cfg.test) if name != cfg.baseline else None
        paired = [r.final - base_by_seed[r.seed] for r in trials if r.final is not None and r.seed in base_by_seed]
        rows.append(RecipeSummary(
            recipe=name, seeds=len(trials), final_mean=nanmean(final), final_ci=ci(final),
            final_greedy_mean=nanmean([r.final_greedy for r in trials]),
            delta=nanmean(final) - nanmean(base), p_value=math.nan if p_value is None else p_value,
            paired_delta=nanmean(paired), paired_delta_ci=ci(paired) if name != cfg.baseline else None,
            reached=len(hits),
            steps_to_target=nanmean(steps), steps_to_target_ci=ci(steps),
            cpu_to_target=nanmean(cpu), cpu_to_target_ci=ci(cpu),
            wall_to_target=nanmean(wall), wall_to_target_ci=ci(wall),
            steps=nanmean([r.steps for r in trials]), cpu_s=nanmean([r.cpu_s for r in trials]),
            effective_gradient_ratio=nanmean([v for r in trials for v in r.egr]),
            **{k: nanmean([getattr(r, k) for r in trials])
               for k in ("all_correct", "all_wrong", "responses_per_step", "tokens_per_s")},
        ))
    return rows


BAR_TOLERANCE = 1e-9  # float rounding of the baseline's mean must not hide a seed sitting exactly on it


@dataclass
class SpeedupRow:
    """One recipe against the bar A_base = the baseline's mean final metric (nan = n/a, CIs as in RecipeSummary).

    steps/cpu/wall_to_base are means over the seeds that reached A_base (`reached` of `seeds`); a
    speed-up is the baseline's mean divided by this recipe's mean, so > 1 means it got there faster
    (2.0 = in half the steps). The CPU-seconds speed-up is the equal-compute view: a recipe whose steps
    cost more pays for it there. nan when this recipe reached A_base on no seed; 1 for the baseline.
    """

    recipe: str
    seeds: int  # finished trials (one without any held-out eval counts as not reached)
    reached: int
    steps_to_base: float
    steps_to_base_ci: tuple[float, float] | None
    cpu_to_base: float
    cpu_to_base_ci: tuple[float, float] | None
    wall_to_base: float
    wall_to_base_ci: tuple[float, float] | None
    speedup_steps: float
    speedup_steps_ci: tuple[float, float] | None
    speedup_cpu: float
    speedup_cpu_ci: tuple[float, float] | None
    speedup_wall: float
    speedup_wall_ci: tuple[float, float] | None


@dataclass
class Speedups:
    """The "reaches the baseline's accuracy in k x fewer steps" figure; `note` says why it is missing."""

    baseline: str
    metric: str
    base_final: float  # A_base: the bar every recipe's steps are counted to; nan without baseline trials
    rows: list[SpeedupRow] = field(default_factory=list)
    note: str = ""


def speedups(results: list[TrialResult], cfg: BenchConfig) -> Speedups:
    """Steps / CPU s / wall s of every recipe to the baseline's mean final metric, as ratios to the baseline's."""
    base_finals = [r.final for r in results if r.recipe == cfg.baseline and r.final is not None]
    out = Speedups(cfg.baseline, cfg.metric, nanmean(base_finals))
    if not base_finals:
        out.note = f"no finished `{cfg.baseline}` trial with a held-out `{cfg.metric}`: no baseline to compare with"
        return out

    def costs(name: str) -> list[list[float]]:  # [steps, cpu, wall], each per seed, nan = not reached
        hits = [r.to_target(out.base_final - BAR_TOLERANCE) for r in results if r.recipe == name]
        return [[math.nan if h is None else float(h[i]) for h in hits] for i in range(3)]

    def ci(values: list[float]) -> tuple[float, float] | None:
        return bootstrap_ci(values, cfg.confidence, cfg.bootstrap_resamples)

    base = costs(cfg.baseline)
    for name in cfg.recipes:
        mine = costs(name)
        if not mine[0]:
            continue  # no finished trial of this recipe: the main table already says so
        ratios: list[float] = []
        intervals: list[tuple[float, float] | None] = []
        for b, m in zip(base, mine):
            is_base = name == cfg.baseline
            ratios.append(1.0 if is_base else ratio_of_means(np.asarray(b), np.asarray(m)))
            intervals.append(None if is_base or math.isnan(ratios[-1]) else
                             bootstrap_ratio_ci(b, m, cfg.confidence, cfg.bootstrap_resamples))
        out.rows.append(SpeedupRow(
            recipe=name, seeds=len(mine[0]), reached=sum(math.isfinite(v) for v in mine[0]),
            steps_to_base=nanmean(mine[0]), steps_to_base_ci=ci(mine[0]),
            cpu_to_base=nanmean(mine[1]), cpu_to_base_ci=ci(mine[1]),
            wall_to_base=nanmean(mine[2]), wall_to_base_ci=ci(mine[2]),
            speedup_steps=ratios[0], speedup_steps_ci=intervals[0],
            speedup_cpu=ratios[1], speedup_cpu_ci=intervals[1],
            speedup_wall=ratios[2], speedup_wall_ci=intervals[2],
        ))
    return out


def nanmean(values: list[Any]) -> float:
    """Mean of the finite values; nan when there are none (never a warning)."""
    x = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(np.mean(x)) if x else math.nan


def plain(value: Any) -> Any:
    """nan -> None, tuples -> lists: strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


# --------------------------------------------------------------------------------------
# report.md and summary.json
# --------------------------------------------------------------------------------------


def fmt(value: float | None, ci: tuple[float, float] | None = None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    text = f"{value:.{digits}f}"
    return text + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")


def write_report(out_dir: Path, cfg: BenchConfig, trials: list[Trial], extra: list[str] = (),
                 audit_command: list[str] | None = None) -> Path:
    """Write out_dir/summary.json, out_dir/report.md and out_dir/plots/*.png; returns the report's path.

    `extra` are the command line's overrides for every trial (they win over the bench file's);
    `audit_command` the `grpo-zoo` arguments of the bench's audit (bench.audit_args), named when there
    is no out_dir/audit/audit.json yet.
    """
    from grpo_zoo.bench_plots import write_plots

    status = {(t.recipe, t.seed): t.status() for t in trials}
    results = [r for t in trials if status[(t.recipe, t.seed)] == "done"
               for r in [load_trial(t.run_dir, t.recipe, t.seed, cfg.metric)] if r is not None]
    summaries = summarize(results, cfg)
    speed = speedups(results, cfg)
    plots = write_plots(out_dir / "plots", results, cfg)
    base_lines, base_summary = audit_section(out_dir, cfg, results, audit_command)
    (out_dir / "summary.json").write_text(json.dumps({
        "metric": cfg.metric, "target": cfg.target, "baseline": cfg.baseline, "test": cfg.test,
        "audit": plain(base_summary),
        "recipes": [plain(asdict(s)) for s in summaries],
        "speedup_vs_baseline": plain(asdict(speed)),
        "signal_by_kind": [plain(asdict(k)) for k in signal_by_kind([(r.recipe, r.by_kind) for r in results])],
        "metric_by_slice": [plain(asdict(row)) for row in slice_rows([(r.recipe, r.first_slices, r.final_slices)
                                                                  for r in results])],
        "trials": [{"recipe": t.recipe, "seed": t.seed, "status": status[(t.recipe, t.seed)],
                    "run_dir": str(t.run_dir)} for t in trials],
    }, indent=1))
    lines = report_lines(cfg, summaries, results, status, plots, list(extra), speed, base_lines)
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def report_lines(cfg: BenchConfig, summaries: list[RecipeSummary], results: list[TrialResult],
                 status: dict[tuple[str, int], str], plots: dict[str, str], extra: list[str],
                 speed: Speedups | None = None, base_lines: list[str] | None = None) -> list[str]:
    pct = f"{cfg.confidence:.0%}"
    test = "Welch t-test" if cfg.test == "welch" else "Mann-Whitney U"
    from grpo_zoo.bench import override_strings

    shared = {o.split("=", 1)[0]: o for o in [*override_strings(cfg.overrides), *extra]}  # the last one wins
    budget = ", ".join(f"`{o}`" for o in shared.values()) or "the recipes' own settings"
    lines = [f"# Benchmark: {', '.join(cfg.recipes)}", "", *([cfg.description, ""] if cfg.description else []),
             f"{len(cfg.recipes)} recipes x {len(cfg.seeds)} seeds (train.seed {cfg.seeds}); every arm shares: "
             f"{budget}. Main metric `{cfg.metric}` on the fixed held-out set; target {cfg.target}; "
             f"p-values: two-sided {test} against `{cfg.baseline}` on the final metric; CIs: {pct} percentile "
             f"bootstrap over seeds (n/a below 2 seeds). Paired Δ: the mean over seeds of (recipe - "
             f"{cfg.baseline} at the same train.seed), which the bench runs back to back, so a pair shares the "
             f"machine's state. Steps / CPU s / wall s to target are means over the seeds "
             f"that reached it; wall s is training time without evals. Effective gradient ratio and group shares "
             f"are of the groups trained on: dynamic sampling (dapo) drops all-equal groups before that (its "
             f"`selector/dapo/pass_rate` is the share it kept); responses/step counts every generated response.",
             *(base_lines or []), "", "## Results", "",
             f"| recipe | done | final {cfg.metric} [{pct} CI] | greedy | Δ vs {cfg.baseline} | p "
             f"| paired Δ [{pct} CI] | reached target | "
             "steps to target | CPU s to target | wall s to target | steps | CPU s | eff. grad ratio | all-correct | "
             "all-wrong | responses/step | tokens/s |",
             "|" + "---|" * 18]
    for s in summaries:
        lines.append(
            f"| {s.recipe} | {s.seeds}/{len(cfg.seeds)} | {fmt(s.final_mean, s.final_ci)} | {fmt(s.final_greedy_mean)} "
            f"| {'baseline' if s.recipe == cfg.baseline else fmt(s.delta)} | {fmt(s.p_value, digits=4)} "
            f"| {'baseline' if s.recipe == cfg.baseline else fmt(s.paired_delta, s.paired_delta_ci)} "
            f"| {s.reached} of {s.seeds} "
            f"| {fmt(s.steps_to_target, s.steps_to_target_ci, 1)} | {fmt(s.cpu_to_target, s.cpu_to_target_ci, 0)} "
            f"| {fmt(s.wall_to_target, s.wall_to_target_ci, 0)} | {fmt(s.steps, digits=1)} | {fmt(s.cpu_s, digits=0)} "
            f"| {fmt(s.effective_gradient_ratio)} | {fmt(s.all_correct)} | {fmt(s.all_wrong)} "
            f"| {fmt(s.responses_per_step, digits=1)} | {fmt(s.tokens_per_s, digits=0)} |")
    lines += speedup_lines(cfg, speed if speed is not None else speedups(results, cfg))
    lines += signal_lines(signal_by_kind([(r.recipe, r.by_kind) for r in results]), fmt)
    lines += slice_lines(slice_rows([(r.recipe, r.first_slices, r.final_slices) for r in results]), cfg.metric, fmt)
    lines += ["", "## Plots", ""]
    lines += [f"![{title}](plots/{name})" for title, name in plots.items()] or ["(no finished trials to plot)"]
    lines += ["", "## Trials", "",
              f"| recipe | seed | status | steps | CPU s | final {cfg.metric} | reached target at step |",
              "|---|---|---|---|---|---|---|"]
    by_key = {(r.recipe, r.seed): r for r in results}
    for (recipe, seed), state in status.items():
        r = by_key.get((recipe, seed))
        hit = r.to_target(cfg.target) if r else None
        reached = str(hit[0]) if hit else ("not reached" if r else "")
        lines.append(f"| {recipe} | {seed} | {state} | {r.steps if r else ''} | {fmt(r.cpu_s, digits=0) if r else ''} "
                     f"| {fmt(r.final) if r else ''} | {reached} |")
    return lines


def speedup_lines(cfg: BenchConfig, speed: Speedups) -> list[str]:
    """The report's "Speed-up vs <baseline>" section (a heading, one sentence, a table, or why there is none)."""
    pct = f"{cfg.confidence:.0%}"
    bar = fmt(speed.base_final)
    lines = ["", f"## Speed-up vs {speed.baseline} (steps to the baseline's final {speed.metric} = {bar})", ""]
    if speed.note:
        return [*lines, f"Not available: {speed.note}."]
    lines += [f"A_base = {bar} is the mean over `{speed.baseline}`'s seeds of its final `{speed.metric}`; each "
              f"seed's cost is the first eval step (and its CPU seconds) at which it reached A_base. Speed-up = "
              f"`{speed.baseline}`'s mean steps (CPU s) to A_base / this recipe's, means over the seeds that "
              f"reached it, so > 1 means faster than the baseline; the CPU-s speed-up is the equal-compute view. "
              f"CIs: {pct} bootstrap over seeds, each recipe's seeds resampled independently (n/a below 2 "
              f"seeds that reached it).", "",
              f"| recipe | reached | steps to it (mean [{pct} CI]) | speed-up in steps [CI] | speed-up in CPU s [CI] |",
              "|---|---|---|---|---|"]
    for row in speed.rows:
        if row.recipe == speed.baseline:
            step_up = cpu_up = "1 (baseline)"
        elif not row.reached:
            step_up = cpu_up = "not reached"
        else:
            step_up = fmt(row.speedup_steps, row.speedup_steps_ci, 2)
            cpu_up = fmt(row.speedup_cpu, row.speedup_cpu_ci, 2)
        steps = fmt(row.steps_to_base, row.steps_to_base_ci, 1) if row.reached else "not reached"
        lines.append(f"| {row.recipe} | {row.reached}/{row.seeds} | {steps} | {step_up} | {cpu_up} |")
    return lines


# --------------------------------------------------------------------------------------
# The starting base: OUT/audit/audit.json
# --------------------------------------------------------------------------------------

PER_QUESTION_KEYS = ("question_ids", "successes", "original_successes")  # left out of summary.json


def audit_section(out_dir: Path, cfg: BenchConfig, results: list[TrialResult],
                  audit_command: list[str] | None = None) -> tuple[list[str], dict[str, Any]]:
    """The report's "Starting base (grpo-zoo audit)" section and summary.json's "audit" entry.

    Without out_dir/audit/audit.json: one line (not audited, or failed) naming the command that audits.
    """
    from grpo_zoo.bench import AUDIT_DIR, audit_key, audit_status

    arm = cfg.audit.recipe or cfg.baseline
    command = (shlex.join(["grpo-zoo", *audit_command]) if audit_command else
               f"grpo-zoo audit --config {cfg.recipes[arm].recipe} --out {out_dir / AUDIT_DIR}")
    lines = ["", "## Starting base (grpo-zoo audit)", ""]
    path = out_dir / AUDIT_DIR / "audit.json"
    state = audit_status(out_dir)
    if not path.is_file():
        if state.get("status") == "failed" or (out_dir / AUDIT_DIR / "audit.log").is_file():
            code = state.get("returncode")
            status = "failed"
            how = " or was interrupted" if state.get("status") != "failed" else f" (exit code {code})"
            text = (f"Not audited: audit failed{how}, see "
                    f"{AUDIT_DIR}/audit.log; the next `grpo-zoo bench` run retries it: `{command}`")
        elif not cfg.audit.enabled:
            status = "disabled"
            text = f"Not audited (`audit.enabled` is false in the bench file); to audit: `{command}`"
        else:
            status = "not_audited"
            text = (f"Not audited yet (`grpo-zoo bench` audits the base before the trials, not on --dry-run or "
                    f"--report-only); to audit: `{command}`")
        return [*lines, text], {"status": status, "command": command, "returncode": state.get("returncode")}
    try:
        data = json.loads(path.read_text())
        body, raw = audit_body(data, arm, results)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        text = (f"Not read: {AUDIT_DIR}/audit.json is not an audit report ({type(exc).__name__}: {exc}); delete "
                f"{out_dir / AUDIT_DIR} and rerun `grpo-zoo bench` to audit again.")
        return [*lines, text], {"status": "unreadable", "command": command, "error": str(exc)}
    stale = bool(audit_command and state.get("key") and state["key"] != audit_key(audit_command))
    if stale:
        body += ["", f"> **Note:** {AUDIT_DIR}/audit.json was made by another audit command than the bench file "
                 f"gives now (recipe, overrides or sizes changed) and was kept; delete {out_dir / AUDIT_DIR} and "
                 "rerun `grpo-zoo bench` to audit again."]
    return [*lines, *body], {"status": "done", "command": state.get("command", command), "stale": stale, **raw}


def audit_body(data: dict[str, Any], arm: str, results: list[TrialResult]) -> tuple[list[str], dict[str, Any]]:
    """Lines and raw figures of an audit.json (AuditResult.to_dict() of grpo_zoo.audit_report)."""
    o, settings = data["originals"], data.get("settings") or {}
    pct = f"{settings.get('level', 0.95):.0%}"
    greedy = "" if o.get("greedy_pass1") is None else " + 1 greedy"
    lines = [f"Model `{data['model']}` on `{data['data']}` (a pool of {data.get('pool_size', '?')} training "
             f"questions), audited before the trials under the `{arm}` arm's recipe with the bench's overrides: "
             f"{o['questions']} questions x G = {o['group_size']} sampled responses{greedy}, seed "
             f"{settings.get('seed', 0)}. Details: [audit/audit.md](audit/audit.md).", ""]
    lines += [f"> **Audit warning:** {w}" for w in data.get("warnings") or []] + ([""] if data.get("warnings") else [])
    passk = {k: v for k, v in (o.get("pass_at_k") or {}).items() if k != "pass@1"}
    lines += [f"| questions x G | all-wrong | mixed | all-right | sampled pass@1 [{pct} CI] | greedy pass@1 | "
              + "".join(f"{k} | " for k in passk) + "parsed |",
              "|" + "---|" * (7 + len(passk)),
              f"| {o['questions']} x {o['group_size']} | {share(o['share_all_wrong'])} | {share(o['share_mixed'])} | "
              f"{share(o['share_all_right'])} | {fmt(o['sampled_pass1'], ci_of(o.get('sampled_pass1_ci')))} | "
              f"{fmt(o.get('greedy_pass1'))} | " + "".join(f"{fmt(v)} | " for v in passk.values())
              + f"{share(o.get('parse_rate'))} |", ""]
    kinds = data.get("kinds") or {}
    if kinds:
        lines += [f"| kind | n | pass@1 | original | diff [{pct} CI] | verdict |", "|---|---|---|---|---|---|"]
        for name, k in kinds.items():
            lo, hi = k["difference_ci"]
            verdict = f"**inverted** (meant {k['intended']})" if k["verdict"] == "inverted" else k["verdict"]
            lines.append(f"| {name} | {k['stats']['questions']} | {fmt(k['stats']['sampled_pass1'])} | "
                         f"{fmt(k['original_pass1'])} | {k['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}] | {verdict} |")
        lines += ["", "diff = variant - original sampled pass@1 on the same questions (paired bootstrap); verdict: "
                  "easier / same / harder, inverted when against the kind's intent."]
    else:
        lines.append("No variant kind was audited.")
    if data.get("not_built"):
        lines += ["", "Not built: " + "; ".join(f"{k} ({why})" for k, why in data["not_built"].items()) + "."]
    revisits, in_bench = data.get("revisits") or {}, None
    if revisits.get("distinct_questions"):
        text = (f"Revisits: {revisits['visits_per_question']:.2g} per question at train.steps "
                f"({revisits['distinct_questions']} training questions, {revisits['steps']} steps x "
                f"{revisits['questions_per_step']} questions per step)")
        ran = [r.steps for r in results if r.recipe == arm and r.steps]  # questions per step may differ by arm
        if ran:
            steps = float(np.mean(ran))
            in_bench = {"mean_steps": steps,
                        "visits_per_question": steps * revisits["questions_per_step"] / revisits["distinct_questions"]}
            text += (f"; the finished `{arm}` trials ran {steps:.0f} steps on average: "
                     f"{in_bench['visits_per_question']:.2g} visits per question")
        lines += ["", text + "."]
    keys = ("model", "data", "pool_size", "settings", "originals", "not_built", "durian", "revisits", "warnings",
            "findings", "seconds")
    raw = {"arm": arm, **{k: data.get(k) for k in keys},
           "kinds": {n: {k: v for k, v in kind.items() if k not in PER_QUESTION_KEYS} for n, kind in kinds.items()},
           "revisits_in_bench": in_bench}
    return lines, raw


def share(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


def ci_of(value: Any) -> tuple[float, float] | None:
    return (float(value[0]), float(value[1])) if value and None not in value else None
