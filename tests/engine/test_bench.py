"""`grpo-zoo bench`: statistics on hand-made metrics files, config checks, and one resumable end-to-end run."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from grpo_zoo.bench import (
    BenchConfig,
    BenchError,
    Trial,
    check_fingerprints,
    is_bench_file,
    load_bench,
    override_strings,
    plan_trials,
    run_bench,
    run_trials,
    validate_bench,
)
from grpo_zoo.bench_report import (
    TrialResult,
    bootstrap_ci,
    bootstrap_ratio_ci,
    compare,
    load_trial,
    report_lines,
    speedup_lines,
    speedups,
    summarize,
    write_report,
)
from grpo_zoo.configuration import ConfigError, build

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "configs" / "testbed"


def write_metrics(run_dir, evals, egr, all_correct=None, cpu_per_step=2.0, step_s=1.0, hist=None, done=True):
    """A trial folder like the trainer writes: step 0 = eval only, steps 1..n = training (+ eval)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"step": 0, "eval/pass@1": evals[0], "eval/greedy_accuracy": evals[0]}] if 0 in evals else []
    for step in range(1, len(egr) + 1):
        row = {"step": step, "time/step_s": step_s, "time/cpu_s": cpu_per_step * step, "rollout/generated": 8.0,
               "response/length_mean": 5.0, "groups/effective_gradient_ratio": egr[step - 1],
               "groups/all_correct": (all_correct or [0.0] * len(egr))[step - 1], "groups/all_wrong": 0.0}
        if step in evals:
            row.update({"eval/pass@1": evals[step], "eval/greedy_accuracy": evals[step]})
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if hist:
        (run_dir / "histograms.jsonl").write_text("".join(json.dumps({"step": s, **h}) + "\n" for s, h in hist.items()))
    if done:
        (run_dir / "trial.json").write_text(json.dumps({"status": "done"}))


def bench_cfg(recipes=("grpo", "diva"), **kw):
    return build(BenchConfig, {"recipes": {r: {"recipe": f"{r}.yaml"} for r in recipes}, "seeds": [0, 1, 2],
                               "target": 0.75, "bootstrap_resamples": 999, **kw})


def test_one_trial_by_hand(tmp_path):
    write_metrics(tmp_path, {0: 0.2, 2: 0.5, 4: 0.7}, egr=[1.0, 0.5, 0.5, 0.0], all_correct=[0, 0.25, 0.25, 0.5])
    r = load_trial(tmp_path, "grpo", 0)
    assert (r.steps, r.cpu_s, r.wall_s, r.final) == (4, 8.0, 4.0, 0.7)
    assert r.eval_steps == [0, 2, 4] and r.eval_cpu == [0.0, 4.0, 8.0]
    assert math.isclose(np.mean(r.egr), 0.5) and math.isclose(r.all_correct, 0.25)
    assert math.isclose(r.tokens_per_s, 4 * 8 * 5 / 4.0)  # 4 steps x 8 responses x 5 tokens / 4 s
    assert r.to_target(0.5) == (2, 4.0, 2.0)  # first eval at or above the target
    assert r.to_target(0.9) is None


def synthetic_bench(root):
    """grpo finals 0.6/0.7/0.8 (only 0.8 reaches 0.75); diva 0.8/0.85/0.9 (all reach it, at steps 2, 2, 4)."""
    trials = []
    arms = {"grpo": ([0.6, 0.7, 0.8], [0.5, 0.6, 0.7]), "diva": ([0.8, 0.85, 0.9], [0.8, 0.76, 0.7])}
    for recipe, (finals, mids) in arms.items():
        for seed, (final, mid) in enumerate(zip(finals, mids)):
            run_dir = root / "trials" / recipe / f"seed-{seed}"
            key = "diva/difficulty" if recipe == "diva" else "vade/posterior_mean"
            hist = {2: {key: [0.5, 0.5, 0.6]}, 4: {key: [0.3, 0.7]}}
            write_metrics(run_dir, {0: 0.3, 2: mid, 4: final}, egr=[0.5, 0.6, 0.7, 0.8], hist=hist)
            trials.append(Trial(recipe, seed, Path(f"{recipe}.yaml"), [], run_dir))
    return trials


def test_summary_statistics_match_scipy(tmp_path):
    trials = synthetic_bench(tmp_path)
    results = [load_trial(t.run_dir, t.recipe, t.seed) for t in trials]
    grpo, diva = summarize(results, bench_cfg())
    assert math.isclose(grpo.final_mean, 0.7) and math.isclose(diva.final_mean, 0.85)
    assert math.isclose(diva.delta, 0.15)
    assert math.isclose(diva.p_value, stats.ttest_ind([0.8, 0.85, 0.9], [0.6, 0.7, 0.8], equal_var=False).pvalue)
    assert math.isnan(grpo.p_value)  # the baseline is not tested against itself
    # Paired by seed: diva - grpo = 0.2, 0.15, 0.1 on seeds 0, 1, 2.
    assert math.isclose(diva.paired_delta, 0.15) and grpo.paired_delta_ci is None
    diffs = ([0.2, 0.15, 0.1],)
    paired = stats.bootstrap(diffs, np.mean, n_resamples=999, method="percentile", rng=np.random.default_rng(0))
    assert diva.paired_delta_ci == pytest.approx((paired.confidence_interval.low, paired.confidence_interval.high))
    rng = np.random.default_rng(0)
    ci = stats.bootstrap(([0.6, 0.7, 0.8],), np.mean, n_resamples=999, method="percentile", rng=rng)
    assert grpo.final_ci == pytest.approx((ci.confidence_interval.low, ci.confidence_interval.high))
    assert (grpo.reached, diva.reached) == (1, 3)  # "not reached" seeds are counted, not dropped
    assert grpo.steps_to_target == 4 and grpo.steps_to_target_ci is None  # one seed: no CI
    assert math.isclose(diva.steps_to_target, (2 + 2 + 4) / 3) and math.isclose(diva.cpu_to_target, 2 * 8 / 3)
    assert math.isclose(diva.effective_gradient_ratio, 0.65)


def test_tests_and_intervals_edge_cases():
    assert compare([0.1, 0.2, 0.4], [0.5, 0.6, 0.9], "mann_whitney") == pytest.approx(
        stats.mannwhitneyu([0.1, 0.2, 0.4], [0.5, 0.6, 0.9], alternative="two-sided").pvalue)
    assert compare([0.5], [0.1, 0.2]) is None  # one seed: untestable, reported n/a
    assert compare([0.5, 0.5], [0.5, 0.5]) is None  # no variance anywhere: no p-value, not a NaN
    assert bootstrap_ci([0.4]) is None and bootstrap_ci([0.4, 0.4]) == (0.4, 0.4)


def test_report_and_plots(tmp_path):
    trials = synthetic_bench(tmp_path)
    trials.append(Trial("grpo", 3, Path("grpo.yaml"), [], tmp_path / "trials" / "grpo" / "seed-3"))  # never ran
    report = write_report(tmp_path, bench_cfg(seeds=[0, 1, 2, 3]), trials)
    text = report.read_text()
    assert "| grpo | 3/4 | 0.700 [" in text and "1 of 3" in text and "not reached" in text and "| new |" in text
    pngs = ("final_accuracy.png", "accuracy_vs_step.png", "effective_gradient_ratio.png", "diva_difficulty.png",
            "vade_posterior_mean.png")
    for png in pngs:
        assert (tmp_path / "plots" / png).stat().st_size > 1000 and f"(plots/{png})" in text
    summary = (tmp_path / "summary.json").read_text()
    assert "NaN" not in summary and json.loads(summary)["recipes"][1]["reached"] == 3


def test_accuracy_curve_joins_only_the_evals_every_seed_ran():
    """Budget-ended seeds stop at different steps: the mean line must not jump as seeds drop out."""
    from matplotlib.figure import Figure

    from grpo_zoo.bench_plots import draw_curve

    a = TrialResult("grpo", 0, eval_steps=[0, 20, 40, 45], eval_values=[0.5, 0.6, 0.7, 0.9],
                    eval_cpu=[0.0, 10.0, 20.0, 22.0])
    b = TrialResult("grpo", 1, eval_steps=[0, 20, 40, 50], eval_values=[0.5, 0.5, 0.6, 0.6],
                    eval_cpu=[0.0, 11.0, 21.0, 24.0])
    for on_cpu, shared_x, end_x in ((False, [0, 20, 40], 47.5), (True, [0.0, 10.5, 20.5], 23.0)):
        ax = Figure().subplots()
        draw_curve(ax, [a, b], on_cpu, "C0", "grpo", 0.95)
        solid, dashed, marker = ax.lines[:3]
        assert list(solid.get_xdata()) == pytest.approx(shared_x)
        assert list(solid.get_ydata()) == pytest.approx([0.5, 0.55, 0.65])
        assert list(dashed.get_xdata()) == pytest.approx([shared_x[-1], end_x])
        assert list(marker.get_ydata()) == pytest.approx([0.75])  # the mean of the seeds' last evals


SPEEDUP_ARMS = {  # recipe -> (CPU s per step, held-out curve per seed at steps 0, 10, ..., 50)
    "grpo": (2.0, [[0.2, 0.3, 0.4, 0.45, 0.5, 0.5],  # final 0.5: never reaches A_base = mean(0.5, 0.6, 0.7)
                   [0.2, 0.3, 0.4, 0.5, 0.55, 0.6],  # reaches 0.6 at step 50, exactly on the bar
                   [0.2, 0.3, 0.5, 0.65, 0.7, 0.7]]),  # at step 30: the baseline's mean is 40 steps
    "diva": (4.0, [[0.2, 0.6, 0.7, 0.7, 0.8, 0.8],  # steps 10, 30, 20: mean 20 = 2x fewer steps than grpo,
                   [0.2, 0.3, 0.5, 0.6, 0.7, 0.75],  # but each step costs 2x the CPU: 1x in CPU s
                   [0.2, 0.4, 0.62, 0.7, 0.7, 0.8]]),
    "slow": (2.0, [[0.2, 0.3, 0.4, 0.5, 0.55, f] for f in (0.55, 0.5, 0.45)]),  # never reaches 0.6
    "solo": (4.0, [[0.2, 0.9, 0.9, 0.9, 0.9, 0.9]]),  # one seed: step 10 (4x), CPU 40 s (2x), no CI
}


def speedup_bench(root, arms=SPEEDUP_ARMS):
    trials = []
    for recipe, (cpu_per_step, curves) in arms.items():
        for seed, curve in enumerate(curves):
            run_dir = root / "trials" / recipe / f"seed-{seed}"
            write_metrics(run_dir, dict(zip(range(0, 60, 10), curve)), egr=[0.5] * 50, cpu_per_step=cpu_per_step)
            trials.append(Trial(recipe, seed, Path(f"{recipe}.yaml"), [], run_dir))
    return trials


def test_speedup_vs_baseline(tmp_path):
    results = [load_trial(t.run_dir, t.recipe, t.seed) for t in speedup_bench(tmp_path)]
    speed = speedups(results, bench_cfg(("grpo", "diva", "slow", "solo")))
    assert speed.base_final == pytest.approx(0.6) and not speed.note
    grpo, diva, slow, solo = speed.rows
    assert (grpo.reached, grpo.seeds, grpo.steps_to_base, grpo.cpu_to_base) == (2, 3, 40, 80)
    assert grpo.speedup_steps == 1.0 and grpo.speedup_steps_ci is None
    assert (diva.reached, diva.steps_to_base, diva.cpu_to_base) == (3, 20, 80)
    assert diva.speedup_steps == pytest.approx(2.0) and diva.speedup_wall == pytest.approx(2.0)
    assert diva.speedup_cpu == pytest.approx(1.0)  # equal compute: no faster at all
    low, high = diva.speedup_steps_ci  # resampled means lie in [30, 50] / [10, 30]
    assert 1.0 <= low < 2.0 < high <= 5.0
    assert diva.steps_to_base_ci == pytest.approx(bootstrap_ci([10, 30, 20], 0.95, 999))
    assert (slow.reached, slow.seeds) == (0, 3) and math.isnan(slow.speedup_steps) and slow.speedup_steps_ci is None
    assert math.isnan(slow.steps_to_base) and math.isnan(slow.speedup_cpu)
    assert (solo.reached, solo.speedup_steps, solo.speedup_cpu) == (1, 4.0, 2.0)
    assert solo.speedup_steps_ci is None and solo.steps_to_base_ci is None  # one seed: CI n/a


def test_ratio_bootstrap_edge_cases():
    assert bootstrap_ratio_ci([40, 40], [20, 20, None]) == pytest.approx((2.0, 2.0))  # no spread, not-reached skipped
    assert bootstrap_ratio_ci([40, None, None], [20, 10]) is None  # one reached seed on a side: n/a
    ci = bootstrap_ratio_ci([50, 30, None], [10, 30, 20], resamples=999)
    assert ci == bootstrap_ratio_ci([50, 30, None], [10, 30, 20], resamples=999)  # seeded: reproducible
    assert 1.0 <= ci[0] < ci[1] <= 5.0


def test_speedup_section_in_report(tmp_path):
    cfg = bench_cfg(("grpo", "diva", "slow", "solo"))
    report = write_report(tmp_path, cfg, speedup_bench(tmp_path))
    text = report.read_text()
    heading = "## Speed-up vs grpo (steps to the baseline's final eval/pass@1 = 0.600)"
    assert heading in text and text.index("| grpo | 3/3 |") < text.index(heading) < text.index("## Plots")
    assert "| grpo | 2/3 | 40.0 [30.0, 50.0] | 1 (baseline) | 1 (baseline) |" in text
    assert "| diva | 3/3 | 20.0 [" in text and "| 2.00 [" in text and "| 1.00 [" in text
    assert "| slow | 0/3 | not reached | not reached | not reached |" in text
    assert "| solo | 1/1 | 10.0 | 4.00 | 2.00 |" in text and "> 1 means faster than the baseline" in text
    summary = json.loads((tmp_path / "summary.json").read_text())["speedup_vs_baseline"]
    assert summary["baseline"] == "grpo" and summary["base_final"] == pytest.approx(0.6)
    rows = {row["recipe"]: row for row in summary["rows"]}
    assert rows["diva"]["speedup_steps"] == pytest.approx(2.0) and rows["diva"]["speedup_cpu"] == pytest.approx(1.0)
    assert rows["slow"]["speedup_steps"] is None and rows["slow"]["reached"] == 0  # nan -> null, strict JSON


def test_speedup_without_baseline(tmp_path):
    cfg = bench_cfg(("grpo", "diva"))
    trials = speedup_bench(tmp_path, {"diva": SPEEDUP_ARMS["diva"]})
    results = [load_trial(t.run_dir, t.recipe, t.seed) for t in trials]
    speed = speedups(results, cfg)
    assert speed.rows == [] and math.isnan(speed.base_final) and "no finished `grpo` trial" in speed.note
    assert "Not available: no finished `grpo` trial" in "\n".join(speedup_lines(cfg, speed))
    status = {(t.recipe, t.seed): "done" for t in trials} | {("grpo", 0): "failed"}
    text = "\n".join(report_lines(cfg, summarize(results, cfg), results, status, {}, []))
    assert "## Speed-up vs grpo (steps to the baseline's final eval/pass@1 = n/a)" in text


@pytest.mark.parametrize("change, message", [
    ({"baseline": "ppo"}, "'baseline' 'ppo' is not among"),
    ({"seeds": [1, 1]}, "distinct"),
    ({"seed": [1]}, "Did you mean 'seeds'"),
    ({"target": 80}, "'target' must be an accuracy"),
    ({"overrides": {"train.seed": 3}}, "may not set 'train.seed'"),
    ({"recipes": {"grpo": {"recipe": "grpo.yaml", "overrides": {"eval.samples": 2}}}}, "set it in the common"),
    ({"recipes": {"bad/name": "grpo.yaml"}}, "names a folder"),
    ({"audit": {"questions": 0}}, "audit: 'questions' must be >= 1"),
    ({"audit": {"variant_questions": -1}}, "'variant_questions' >= 0"),
    ({"audit": {"kinds": ["hint_9"]}}, "'kinds' must be null"),
    ({"audit": {"kinds": []}}, "'kinds' must be null"),
    ({"audit": {"recipe": "diva"}}, "'audit.recipe' 'diva' is not among the recipes"),
    ({"audit": {"enable": False}}, "Did you mean 'enabled'"),
])
def test_config_errors(tmp_path, change, message):
    data = {"recipes": {"grpo": str(RECIPES / "grpo.yaml")}, **change}
    (tmp_path / "b.yaml").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=message):
        load_bench(tmp_path / "b.yaml")


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "bench").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_bench_files_validate(path):
    assert is_bench_file(path)
    assert "recipes x" in validate_bench(path)
    cfg = load_bench(path)
    assert len(cfg.seeds) >= (5 if path.stem in ("testbed", "default_run") else 2)
    # Algorithm comparisons test against GRPO; default_run tests lr settings against the default recipe.
    assert cfg.baseline == ("default" if path.stem == "default_run" else "grpo")
    if path.stem in ("testbed", "quick"):  # the seed papers' arms; testbed_more holds the other baselines
        assert {"grpo", "dr_grpo", "rloo", "dapo", "gspo", "durian", "vade", "diva", "diva_vade"} <= set(cfg.recipes)


# --------------------------------------------------------------------------------------
# The starting base's audit (OUT/audit/audit.json) in the report; no real audit runs here
# --------------------------------------------------------------------------------------


def write_audit(out_dir, greedy=True, warnings=()):
    """OUT/audit/audit.json as `grpo-zoo audit` writes it (AuditResult.to_dict()), from hand-made counts at G=4."""
    from grpo_zoo.audit_report import AuditResult, compare_kind, group_stats, revisits

    c = np.array([0, 0, 1, 2, 4, 4, 3, 0, 2, 4])  # 3 all wrong, 3 all right, 4 mixed
    stats = dict(resamples=200, level=0.95, seed=0)
    hint = compare_kind("hint_1", "hint", np.array([2, 1, 3, 4, 4, 4]), c[:6], 4, question_ids=list(range(6)), **stats)
    noise = compare_kind("perturb_noise", "perturb", np.array([1, 2, 2, 3, 4, 4]), c[:6], 4,
                         question_ids=list(range(6)), **stats)
    result = AuditResult(
        model="testbed", data="testbed", prompt_template="{problem}", system_prompt="", pool_size=200,
        settings={"questions": 10, "variant_questions": 6, "group_size": 4, "seed": 0, "level": 0.95},
        originals=group_stats(c, 4, greedy=np.array([0, 1] * 5) if greedy else None, parse_rate=0.9, **stats),
        question_ids=list(range(10)), successes=c.tolist(), kinds={"hint_1": hint, "perturb_noise": noise},
        not_built={"paraphrase": "no question has paraphrases"}, durian={}, revisits=revisits(200, 100, 16),
        warnings=list(warnings),
    )
    (out_dir / "audit").mkdir(parents=True, exist_ok=True)
    (out_dir / "audit" / "audit.json").write_text(json.dumps(result.to_dict(), indent=1))
    return result


@pytest.fixture
def no_plots(monkeypatch):
    """The report without its PNGs: the audit tests check text and JSON only."""
    monkeypatch.setattr("grpo_zoo.bench_plots.write_plots", lambda plot_dir, results, cfg: {})


def test_report_states_the_starting_base(tmp_path, no_plots):
    result = write_audit(tmp_path, warnings=["only 40% of the responses have a \\boxed{} answer"])
    report = write_report(tmp_path, bench_cfg(), synthetic_bench(tmp_path))
    text = report.read_text()
    heading = "## Starting base (grpo-zoo audit)"
    assert text.index("# Benchmark") < text.index(heading) < text.index("## Results") < text.index("| grpo | 3/3 |")
    assert "Model `testbed` on `testbed` (a pool of 200 training questions)" in text
    assert "under the `grpo` arm's recipe" in text and "10 questions x G = 4 sampled responses + 1 greedy" in text
    o = result.originals
    lo, hi = o.sampled_pass1_ci
    assert (f"| 10 x 4 | 30.0% | 40.0% | 30.0% | {o.sampled_pass1:.3f} [{lo:.3f}, {hi:.3f}] | 0.500 | "
            f"{o.pass_at_k['pass@2']:.3f} | {o.pass_at_k['pass@4']:.3f} | 90.0% |") in text
    assert "| kind | n | pass@1 | original | diff [95% CI] | verdict |" in text
    hint = result.kinds["hint_1"]
    assert (f"| hint_1 | 6 | {hint.stats.sampled_pass1:.3f} | {hint.original_pass1:.3f} | {hint.difference:+.3f} "
            f"[{hint.difference_ci[0]:+.3f}, {hint.difference_ci[1]:+.3f}] | {hint.verdict} |") in text
    noise = result.kinds["perturb_noise"]
    assert noise.verdict == "inverted" and "| **inverted** (meant harder) |" in text  # easier than the original
    assert "Not built: paraphrase (no question has paraphrases)." in text
    assert "> **Audit warning:** only 40% of the responses" in text
    # 200 questions, 100 steps x 16: 8 visits; the synthetic trials ran 4 steps: 4 x 16 / 200 = 0.32
    assert "Revisits: 8 per question at train.steps (200 training questions, 100 steps x 16 questions per step)" in text
    assert "the finished `grpo` trials ran 4 steps on average: 0.32 visits per question" in text
    summary = json.loads((tmp_path / "summary.json").read_text())["audit"]
    assert summary["status"] == "done" and summary["arm"] == "grpo" and summary["model"] == "testbed"
    assert summary["originals"]["share_all_wrong"] == pytest.approx(0.3)
    assert summary["originals"]["sampled_pass1_ci"] == pytest.approx(list(o.sampled_pass1_ci))
    assert summary["kinds"]["hint_1"]["verdict"] == hint.verdict and "successes" not in summary["kinds"]["hint_1"]
    assert summary["revisits"]["visits_per_question"] == 8 and summary["revisits_in_bench"]["mean_steps"] == 4


def test_report_without_an_audit(tmp_path, no_plots):
    trials = synthetic_bench(tmp_path)
    write_report(tmp_path, bench_cfg(), trials, audit_command=["audit", "--config", "g.yaml", "--out", "o/audit"])
    text = (tmp_path / "report.md").read_text()
    assert "## Starting base (grpo-zoo audit)\n\nNot audited yet" in text
    assert "to audit: `grpo-zoo audit --config g.yaml --out o/audit`" in text
    summary = json.loads((tmp_path / "summary.json").read_text())["audit"]
    assert summary == {"status": "not_audited", "command": "grpo-zoo audit --config g.yaml --out o/audit",
                       "returncode": None}
    write_report(tmp_path, bench_cfg(audit={"enabled": False}), trials)
    assert "Not audited (`audit.enabled` is false in the bench file); to audit: `grpo-zoo audit --config grpo.yaml" \
        in (tmp_path / "report.md").read_text()
    (tmp_path / "audit").mkdir()
    (tmp_path / "audit" / "audit.log").write_text("Traceback ...\n")
    (tmp_path / "audit" / "status.json").write_text(json.dumps({"status": "failed", "returncode": 2}))
    write_report(tmp_path, bench_cfg(), trials)
    assert "Not audited: audit failed (exit code 2), see audit/audit.log" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "summary.json").read_text())["audit"]["status"] == "failed"


def audit_bench(tmp_path, **audit):
    path = tmp_path / "bench.yaml"
    path.write_text(json.dumps({"recipes": {"grpo": str(RECIPES / "grpo.yaml")}, "seeds": [0],
                                "overrides": {"train.steps": 3, "eval.samples": 2}, "threads_per_trial": 1,
                                "audit": {"questions": 16, "variant_questions": 4, **audit}}))
    return path


@pytest.fixture
def fake_runner(monkeypatch):
    """Records every `grpo_zoo.cli` call run_bench makes; an audit writes a synthetic audit.json unless told to fail."""
    calls = []
    fail = []

    def run(args, env, log_path, cwd):
        calls.append((list(args), env, log_path))
        if args[0] == "audit":
            if fail:
                Path(log_path).open("a").write("grpo-zoo audit: error: boom\n")
                return 2, 0.1
            write_audit(Path(args[args.index("--out") + 1]).parent)
        return 0, 0.1

    monkeypatch.setattr("grpo_zoo.bench.run_trial_process", run)
    return calls, fail


def test_bench_audits_the_base_once_before_the_trials(tmp_path, fake_runner, no_plots, capsys):
    from grpo_zoo.cli import build_parser
    from grpo_zoo.config import load_config

    calls, _ = fake_runner
    path, out = audit_bench(tmp_path), tmp_path / "out"
    result = run_bench(path, ["rollout.max_new_tokens=6"], output_dir=str(out))
    assert result.audit == "done" and [c[0][0] for c in calls] == ["audit", "train"]  # the audit comes first
    args, env, log = calls[0]
    assert args[:3] == ["audit", "--config", str(RECIPES / "grpo.yaml")] and log == str(out / "audit" / "audit.log")
    for flag, value in (("--out", str(out / "audit")), ("--questions", "16"), ("--variant-questions", "4"),
                        ("--threads", "1")):
        assert args[args.index(flag) + 1] == value
    assert "--no-durian" in args and "--kinds" not in args and env["OMP_NUM_THREADS"] == "1"
    parsed = build_parser().parse_args(args)  # the real `grpo-zoo audit` accepts it
    assert parsed.overrides == ["train.steps=3", "eval.samples=2", "rollout.max_new_tokens=6"]
    assert load_config(parsed.config, parsed.overrides).rollout.max_new_tokens == 6
    status = json.loads((out / "audit" / "status.json").read_text())
    assert status["status"] == "done" and status["command"].startswith("grpo-zoo audit --config")
    assert "## Starting base (grpo-zoo audit)\n\nModel `testbed`" in result.report.read_text()
    assert json.loads((out / "summary.json").read_text())["audit"]["status"] == "done"
    capsys.readouterr()
    again = run_bench(path, ["rollout.max_new_tokens=6"], output_dir=str(out))  # resumed: nothing reruns
    assert again.audit == "reused" and len(calls) == 2 and "audit: reusing" in capsys.readouterr().out
    changed = audit_bench(tmp_path, questions=32)  # another audit command: kept, with a warning and a note
    assert run_bench(changed, ["rollout.max_new_tokens=6"], output_dir=str(out)).audit == "reused" and len(calls) == 2
    assert "made by another audit command" in capsys.readouterr().out
    assert "made by another audit command" in (out / "report.md").read_text()


def test_bench_skips_the_audit_on_dry_run_report_only_and_when_off(tmp_path, fake_runner, no_plots, capsys):
    calls, _ = fake_runner
    path, out = audit_bench(tmp_path, kinds=["hint", "paraphrase"], durian=True), tmp_path / "out"
    assert run_bench(path, output_dir=str(out), dry_run=True).audit == ""
    printed = capsys.readouterr().out
    assert "[audit] grpo-zoo audit --config" in printed and "--kinds hint,paraphrase" in printed
    assert "--no-durian" not in printed and not calls
    assert run_bench(path, output_dir=str(out), report_only=True).audit == "" and not calls
    assert "Not audited yet" in (out / "report.md").read_text()
    assert run_bench(audit_bench(tmp_path, enabled=False), output_dir=str(out)).audit == ""
    assert [c[0][0] for c in calls] == ["train"]
    write_audit(out)
    capsys.readouterr()
    run_bench(audit_bench(tmp_path), output_dir=str(out), dry_run=True)
    assert "[audit]" not in capsys.readouterr().out  # already audited: nothing to do


def test_a_failed_audit_does_not_stop_the_bench(tmp_path, fake_runner, no_plots, capsys):
    calls, fail = fake_runner
    fail.append(True)
    path, out = audit_bench(tmp_path), tmp_path / "out"
    result = run_bench(path, output_dir=str(out))
    assert result.audit == "failed" and result.failed == 0 and [c[0][0] for c in calls] == ["audit", "train"]
    assert "warning: the audit failed (exit code 2)" in capsys.readouterr().out
    assert "boom" in (out / "audit" / "audit.log").read_text()
    assert "audit failed (exit code 2), see audit/audit.log" in result.report.read_text()
    fail.clear()
    assert run_bench(path, output_dir=str(out)).audit == "done"  # the next run retries it (the trial is done)
    assert [c[0][0] for c in calls] == ["audit", "train", "audit"]


def test_arms_must_be_comparable(tmp_path):
    (tmp_path / "short.yaml").write_text(f"base: {RECIPES / 'rloo.yaml'}\ntrain: {{steps: 7}}\n")
    recipes = {"grpo": str(RECIPES / "grpo.yaml"), "short": "short.yaml"}
    (tmp_path / "b.yaml").write_text(json.dumps({"recipes": recipes}))
    with pytest.raises(ConfigError, match="'train.steps' is 7 in 'short'"):
        plan_trials(load_bench(tmp_path / "b.yaml"), tmp_path / "b.yaml", tmp_path / "out", [])
    (tmp_path / "b.yaml").write_text(json.dumps({"recipes": {"grpo": "nowhere.yaml"}}))
    with pytest.raises(ConfigError, match="recipe 'nowhere.yaml' not found"):
        plan_trials(load_bench(tmp_path / "b.yaml"), tmp_path / "b.yaml", tmp_path / "out", [])


def test_trial_states_and_changed_config(tmp_path):
    trial = Trial("grpo", 0, RECIPES / "grpo.yaml", ["train.steps=3"], tmp_path / "t", fingerprint="abc")
    assert trial.status() == "new" and "--output-dir" in trial.args()
    (trial.run_dir / "checkpoints" / "step-000002").mkdir(parents=True)
    assert trial.status() == "partial" and trial.args()[-2] == "--resume"  # a killed trial resumes
    trial.marker.write_text(json.dumps({"status": "done", "fingerprint": "other"}))
    with pytest.raises(BenchError, match="different config"):
        check_fingerprints([trial])
    assert override_strings({"a.b": 1e-4, "c": "true", "d": "x", "e": [1, 2]}) == ['a.b=0.0001', 'c="true"', "d=x",
                                                                                   "e=[1, 2]"]


def test_ray_missing_gives_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, installed or not
    trial = Trial("grpo", 0, RECIPES / "grpo.yaml", [], tmp_path / "t")
    with pytest.raises(BenchError, match=r"pip install -e \.\[ray\]"):
        run_trials([trial], 1, 1, ray_address="")
    assert not trial.run_dir.exists()  # nothing touched before the error


# --------------------------------------------------------------------------------------
# End to end: real trials (separate processes) on a tiny random model
# --------------------------------------------------------------------------------------


def tiny_bench(tmp_path, recipes, seeds, audit=None):
    from grpo_zoo.testbed.tiny_model import build_tiny_vlm

    model = build_tiny_vlm(tmp_path / "m", seed=0)
    path = tmp_path / "bench.yaml"
    path.write_text(json.dumps({"recipes": {r: str(RECIPES / f"{r}.yaml") for r in recipes}, "seeds": seeds,
                                "target": 0.5, "bootstrap_resamples": 199, "parallel": 2, "threads_per_trial": 1,
                                "overrides": {"eval.every": 0}, "audit": audit or {"enabled": False}}))
    overrides = [f"model.path={model}", "testbed.train_questions=48", "testbed.eval_questions=8",
                 "rollout.group_size=4", "rollout.max_new_tokens=6", "train.steps=2", "train.questions_per_step=2",
                 "eval.num_questions=8", "eval.samples=2", "reward.num_workers=0", "output.tensorboard=false",
                 "output.progress=false"]
    return path, overrides


def test_bench_end_to_end_and_resumable(tmp_path, capsys):
    from grpo_zoo.cli import main

    audit = {"questions": 8, "variant_questions": 2}  # a real audit, tiny: a random model parses nothing
    path, overrides = tiny_bench(tmp_path, ["grpo", "vade"], [0, 1], audit)
    out = tmp_path / "out"
    assert main(["bench", str(path), *overrides, "--output-dir", str(out)]) == 0
    assert (out / "audit" / "audit.log").is_file() and (out / "audit" / "status.json").is_file()
    audited = (out / "audit" / "status.json").stat().st_mtime_ns
    markers = sorted(out.glob("trials/*/seed-*/trial.json"))
    assert len(markers) == 4 and all(json.loads(m.read_text())["status"] == "done" for m in markers)
    assert all(len((m.parent / "metrics.jsonl").read_text().splitlines()) == 3 for m in markers)  # steps 0, 1, 2
    assert (out / "trials" / "vade" / "seed-0" / "histograms.jsonl").is_file()
    text = (out / "report.md").read_text()
    assert "| vade | 2/2 |" in text and (out / "plots" / "vade_posterior_mean.png").is_file()
    stamps = [m.stat().st_mtime_ns for m in markers]
    capsys.readouterr()
    assert main(["bench", str(path), *overrides, "--output-dir", str(out)]) == 0
    assert "4 done, 0 to run" in capsys.readouterr().out
    assert [m.stat().st_mtime_ns for m in markers] == stamps  # nothing reran
    assert "## Starting base (grpo-zoo audit)" in (out / "report.md").read_text()
    if (out / "audit" / "audit.json").is_file():  # audited once: kept, not rerun
        assert (out / "audit" / "status.json").stat().st_mtime_ns == audited


def test_failed_trial_is_reported_and_rerun(tmp_path, capsys):
    trial = Trial("grpo", 0, RECIPES / "grpo.yaml", ["train.stepz=3"], tmp_path / "t")  # fails fast in the child
    assert run_trials([trial], parallel=1, threads=1) == 1
    assert trial.status() == "failed" and "stepz" in (trial.run_dir / "train.log").read_text()
    assert "failed" in capsys.readouterr().out  # with the log's tail; next `bench` call runs it again


def test_bench_on_local_ray(tmp_path):
    pytest.importorskip("ray")
    from grpo_zoo.bench import run_bench

    path, overrides = tiny_bench(tmp_path, ["grpo"], [0, 1])
    result = run_bench(path, overrides, output_dir=str(tmp_path / "out"), ray=True)
    assert result.failed == 0 and len(result.ran) == 2
    assert all(t.status() == "done" for t in result.ran)
