"""Every registered estimator and loss is a benchmark arm (ALGORITHMS.md: a testbed config and a bench row each).

An alias counts as its own algorithm when it changes the defaults (dapo = ppo_clip with clip-higher,
lite_ppo = grpo with the batch std), so it must appear by name; a pure alias (same function, same
config class) is covered by its target.
"""

from pathlib import Path

import pytest

from grpo_zoo.bench import is_bench_file, load_bench, override_strings, resolve_recipe
from grpo_zoo.config import load_config
from grpo_zoo.registry import ESTIMATORS, LOSSES

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def bench_files() -> list[Path]:
    return sorted(p for p in (CONFIGS / "bench").glob("*.yaml") if is_bench_file(p))


def benchmarked() -> tuple[set[str], set[str]]:
    """(estimator names, loss names) the arms of every bench file train with, after all overrides."""
    estimators, losses = set(), set()
    for path in bench_files():
        bench = load_bench(path)
        common = override_strings(bench.overrides)
        for arm in bench.recipes.values():
            recipe = resolve_recipe(arm.recipe, path)
            assert (CONFIGS / "testbed") in recipe.parents, f"{path.name}: arm {arm.recipe} is not a testbed config"
            cfg = load_config(recipe, [*common, *override_strings(arm.overrides)])
            estimators.add(cfg.algorithm.estimator.name)
            losses.add(cfg.algorithm.loss.name)
    return estimators, losses


def uncovered(registry, used: set[str]) -> list[str]:
    def same(a: str, b: str) -> bool:
        ea, eb = registry.get(a), registry.get(b)
        return ea.obj is eb.obj and ea.config_cls is eb.config_cls

    return [name for name in registry.names() if not any(same(name, u) for u in used)]


@pytest.fixture(scope="module")
def used():
    return benchmarked()


def test_bench_files_exist():
    names = {p.name for p in bench_files()}
    assert {"testbed.yaml", "testbed_more.yaml"} <= names


def test_every_estimator_is_benchmarked(used):
    missing = uncovered(ESTIMATORS, used[0])
    assert not missing, f"estimators with no arm in configs/bench/*.yaml: {missing} (add a testbed config and a row)"


def test_every_loss_is_benchmarked(used):
    missing = uncovered(LOSSES, used[1])
    assert not missing, f"losses with no arm in configs/bench/*.yaml: {missing} (add a testbed config and a row)"


def test_testbed_more_compares_against_grpo():
    bench = load_bench(CONFIGS / "bench" / "testbed_more.yaml")
    assert bench.baseline == "grpo"
    assert {"grpo_passk", "opo", "lite_ppo", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov"} <= set(bench.recipes)
