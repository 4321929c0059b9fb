"""The bench report's "gradient signal by kind of prompt" section, on hand-made metrics files."""

import json
import math
from pathlib import Path

import pytest

from grpo_zoo.bench import BenchConfig, Trial
from grpo_zoo.bench_report import load_trial, write_report
from grpo_zoo.bench_signal import kind_means, signal_by_kind
from grpo_zoo.configuration import build


def write_steps(run_dir: Path, kinds: dict[str, tuple[float, float, float, float]], steps: int = 4) -> None:
    """Training steps whose batches mix `kinds`: kind -> (prompt share, eff. grad ratio, all-correct, all-wrong)."""
    run_dir.mkdir(parents=True)
    rows = [{"step": 0, "eval/pass@1": 0.5}]
    for step in range(1, steps + 1):
        row = {"step": step, "time/step_s": 1.0, "time/cpu_s": 2.0 * step, "groups/effective_gradient_ratio": 0.5}
        for kind, (share, egr, right, wrong) in kinds.items():
            row[f"prompts/share_{kind}"] = share
            if len(kinds) > 1:  # the trainer logs per-kind groups only for mixed batches
                row.update({f"groups/{kind}/effective_gradient_ratio": egr, f"groups/{kind}/all_correct": right,
                            f"groups/{kind}/all_wrong": wrong})
        rows.append(row)
    rows[-1]["eval/pass@1"] = 0.6
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "trial.json").write_text(json.dumps({"status": "done"}))


MIXED = {"original": (0.5, 0.6, 0.2, 0.2), "hint": (0.25, 0.2, 0.8, 0.0), "perturb": (0.25, 0.2, 0.0, 0.8)}


def test_kind_means_and_the_share_of_signal(tmp_path):
    write_steps(tmp_path / "a", MIXED)
    means = kind_means({i: r for i, r in enumerate(json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").open())})
    assert means["hint"] == pytest.approx({"effective_gradient_ratio": 0.2, "all_correct": 0.8, "all_wrong": 0.0,
                                           "prompt_share": 0.25})
    signals = {s.kind: s for s in signal_by_kind([("diva", means), ("diva", means), ("grpo", {})])}
    assert set(signals) == {"original", "hint", "perturb"} and signals["hint"].seeds == 2
    # carrying = share x egr: 0.30, 0.05, 0.05 -> 0.75, 0.125, 0.125 of the signal
    assert signals["original"].signal_share == pytest.approx(0.75)
    assert signals["perturb"].signal_share == pytest.approx(0.125)


def test_report_section_lists_only_arms_that_mix_kinds(tmp_path):
    trials = []
    for recipe, kinds in (("grpo", {"original": (1.0, 0.5, 0.2, 0.3)}), ("diva", MIXED)):
        for seed in (0, 1):
            run_dir = tmp_path / "trials" / recipe / f"seed-{seed}"
            write_steps(run_dir, kinds)
            trials.append(Trial(recipe, seed, Path(f"{recipe}.yaml"), [], run_dir))
    cfg = build(BenchConfig, {"recipes": {r: {"recipe": f"{r}.yaml"} for r in ("grpo", "diva")}, "seeds": [0, 1],
                              "target": 0.55, "bootstrap_resamples": 999})
    text = write_report(tmp_path, cfg, trials).read_text()
    heading = "## Gradient signal by kind of prompt"
    assert text.index("## Speed-up vs grpo") < text.index(heading) < text.index("## Plots")
    assert "| diva | hint | 2 | 0.250 | 0.200 | 0.800 | 0.000 | 0.125 |" in text
    assert "| grpo | original |" not in text
    summary = json.loads((tmp_path / "summary.json").read_text())["signal_by_kind"]
    assert {(s["recipe"], s["kind"]) for s in summary} == {("diva", k) for k in MIXED}
    assert load_trial(trials[0].run_dir, "grpo", 0).by_kind == {}


def test_a_single_kind_arm_has_no_rows_and_nan_never_divides():
    assert signal_by_kind([("grpo", {})]) == []
    (only,) = signal_by_kind([("x", {"hint": {"prompt_share": 0.5, "effective_gradient_ratio": 0.0,
                                              "all_correct": 1.0, "all_wrong": 0.0}})])
    assert math.isnan(only.signal_share)  # no kind carries any signal: not a division by zero
