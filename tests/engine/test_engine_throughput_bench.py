"""Smoke tests of benchmarks/engine_throughput.py at tiny sizes (the TRL arm is skipped)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_throughput.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("engine_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module's names through sys.modules
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


@pytest.fixture(autouse=True)
def _restore_torch_settings():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    torch.set_flush_denormal(False)  # the script sets it process-wide


TINY = ["--questions", "2", "--group", "2", "--max-new-tokens", "4", "--repeats", "1", "--threads", "1"]


def test_arms_run_and_write_json(bench, tmp_path, capsys):
    out = tmp_path / "arms.json"
    bench.main([*TINY, "--trl-python", str(tmp_path / "nowhere" / "python"), "--out", str(out)])
    assert "TRL arm skipped: no TRL venv" in capsys.readouterr().out
    result = json.loads(out.read_text())
    rows = {r["arm"]: r for r in result["rows"]}
    assert set(rows) == {"grpo_zoo", "grpo_zoo_no_sharing", "limit"}
    assert result["trl_skipped"].startswith("no TRL venv") and result["prefix_sharing_speedup"] > 0
    for row in rows.values():
        assert row["mean_tokens_per_response"] == 4.0  # EOS suppressed: every response is max_new_tokens long
        assert row["median_step_s"] > 0 and row["responses_per_s"] > 0
    assert rows["limit"]["ratio_to_limit"] == 1.0


def test_limit_variants_report_gains(bench, tmp_path):
    out = tmp_path / "variants.json"
    bench.main([*TINY, "--limit-variants", "--out", str(out)])
    result = json.loads(out.read_text())
    arms = {r["arm"] for r in result["rows"]}
    assert {"limit", "static_cache", "natural_eos_hf", "natural_eos_drop_finished"} <= arms
    assert "drop_finished_speedup" in result["gains"] and "static_cache_speedup" in result["gains"]


def test_dropping_finished_loop_samples_like_hf_generate(bench, tmp_path):
    """With EOS suppressed (nothing finishes), the custom loop draws the same tokens as HF generate."""
    setup = bench.Setup("text", questions=2, group=3, max_new_tokens=6, threads=1)
    model_dir, data = bench.prepare(setup, tmp_path)
    lb = bench.limit_batch(setup, model_dir, data)
    config = bench.sampling_config(setup, lb.policy)
    with torch.no_grad():
        torch.manual_seed(3)
        hf = lb.model.generate(**lb.inputs, generation_config=config)[:, lb.inputs["input_ids"].shape[1]:]
        torch.manual_seed(3)
        ours = bench.generate_dropping_finished(lb.model, lb.inputs, config)
    assert torch.equal(hf, ours)


def test_bad_sizes_are_rejected(bench):
    with pytest.raises(ValueError, match="--group must be >= 1"):
        bench.main(["--group", "0"])
