"""The bench report's "where the gain is" section: the metric per eval.by slice, on hand-made metrics files."""

import json
from pathlib import Path

from grpo_zoo.bench import BenchConfig, Trial
from grpo_zoo.bench_report import load_trial, write_report
from grpo_zoo.bench_slices import slice_rows, slice_values
from grpo_zoo.configuration import build


def write_trial(run_dir: Path, start: dict[str, float], final: dict[str, float], by: bool = True) -> None:
    """Step 0 and step 2 evals with tier slices of pass@1 (and greedy, which the section must ignore)."""
    run_dir.mkdir(parents=True)
    rows = [{"step": 0, "eval/pass@1": 0.5}, {"step": 1, "time/step_s": 1.0, "time/cpu_s": 2.0},
            {"step": 2, "time/step_s": 1.0, "time/cpu_s": 4.0, "eval/pass@1": 0.6}]
    for row, slices in ((rows[0], start), (rows[2], final)):
        if by:
            row.update({f"eval/tier={t}/pass@1": v for t, v in slices.items()})
            row.update({f"eval/tier={t}/greedy_accuracy": 1.0 for t in slices})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "trial.json").write_text(json.dumps({"status": "done"}))


START = {"0": 0.7, "3": 0.05, "10": 0.2}


def test_slice_values_pick_the_bench_metric_only():
    row = {"eval/pass@1": 0.5, "eval/tier=3/pass@1": 0.1, "eval/tier=3/greedy_accuracy": 0.2,
           "eval/kind=total/pass@1": 0.4, "eval/pass@4": 0.9}
    assert slice_values(row, "eval/pass@1") == {("tier", "3"): 0.1, ("kind", "total"): 0.4}
    assert slice_values(row, "eval/greedy_accuracy") == {("tier", "3"): 0.2}


def test_report_gives_each_arm_its_slices_against_the_start(tmp_path):
    trials = []
    finals = {"grpo": [{"0": 0.8, "3": 0.05, "10": 0.2}, {"0": 0.8, "3": 0.15, "10": 0.2}],
              "diva": [{"0": 0.7, "3": 0.45, "10": 0.3}, {"0": 0.7, "3": 0.35, "10": 0.3}]}
    for recipe, per_seed in finals.items():
        for seed, final in enumerate(per_seed):
            run_dir = tmp_path / "trials" / recipe / f"seed-{seed}"
            write_trial(run_dir, START, final)
            trials.append(Trial(recipe, seed, Path(f"{recipe}.yaml"), [], run_dir))
    cfg = build(BenchConfig, {"recipes": {r: {"recipe": f"{r}.yaml"} for r in finals}, "seeds": [0, 1],
                              "target": 0.55, "bootstrap_resamples": 999})
    text = write_report(tmp_path, cfg, trials).read_text()
    heading = "## Where the gain is"
    assert text.index("## Speed-up vs grpo") < text.index(heading) < text.index("## Plots")
    assert "| tier | seeds | 0 | 3 | 10 |" in text  # the order the eval logged them (numeric), not "0, 10, 3"
    assert "| start | 4 | 0.700 | 0.050 | 0.200 |" in text
    assert "| grpo | 2 | 0.800 (+0.100) | 0.100 (+0.050) | 0.200 (+0.000) |" in text
    assert "| diva | 2 | 0.700 (+0.000) | 0.400 (+0.350) | 0.300 (+0.100) |" in text
    summary = json.loads((tmp_path / "summary.json").read_text())["metric_by_slice"]
    assert [(s["recipe"], s["column"]) for s in summary] == [("start", "tier"), ("grpo", "tier"), ("diva", "tier")]


def test_trials_without_slices_add_no_section(tmp_path):
    write_trial(tmp_path / "t", START, START, by=False)
    result = load_trial(tmp_path / "t", "grpo", 0)
    assert result.first_slices == {} and result.final_slices == {}
    assert slice_rows([("grpo", {}, {})]) == []


def test_eval_slices_name_every_value_safely():
    from grpo_zoo.evaluation import column_values
    from grpo_zoo.types import Prompt

    prompts = [Prompt(str(i), "q", "1", [], extras=extras) for i, extras in
               enumerate([{"s": "alg/geo"}, {"s": 10}, {}, {"s": [1, 2]}, {"s": 9}])]
    # numbers in numeric order, then text; "/" would split the metric name; unhashable values by their text
    assert column_values(prompts, "s") == {"9": [4], "10": [1], "[1, 2]": [3], "alg_geo": [0], "None": [2]}
