"""A third-party plug-in package, installed with pip, is selected by name from a YAML config."""

import importlib.util
import os
import subprocess
import sys
import textwrap

PLUGIN = """
from dataclasses import dataclass

from grpo_zoo.registry import ESTIMATORS
from grpo_zoo.types import AdvantageInputs, AdvantageOutput


@dataclass
class CenteredConfig:
    scale: float = 1.0  # multiplies the centred reward


@ESTIMATORS.register("centered_times", config=CenteredConfig, description="test plug-in: scale * (r - batch mean)")
def centered_times(inputs: AdvantageInputs, cfg: CenteredConfig) -> AdvantageOutput:
    return AdvantageOutput(cfg.scale * (inputs.rewards - inputs.rewards.mean()))
"""

SETUP = """
from setuptools import setup
setup(
    name="grpo-zoo-test-plugin",
    version="0.0.1",
    py_modules=["grpo_zoo_test_plugin"],
    entry_points={"grpo_zoo.estimators": ["centered_times = grpo_zoo_test_plugin"]},
)
"""

USE = """
import torch
from grpo_zoo.config import load_config
from grpo_zoo.registry import ESTIMATORS
from grpo_zoo.types import AdvantageInputs
cfg = load_config("recipe.yaml")
spec = cfg.algorithm.estimator
out = ESTIMATORS.get(spec.name).obj(AdvantageInputs(
    rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), prompt_ids=torch.tensor([0, 0, 1, 1]),
    question_ids=torch.tensor([0, 0, 1, 1]), response_mask=torch.ones(4, 3)), spec.config)
print(spec.name, spec.config.scale, out.advantages.tolist())
"""


def test_installed_plugin_is_selected_from_yaml(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "grpo_zoo_test_plugin.py").write_text(PLUGIN)
    (pkg / "setup.py").write_text(SETUP)
    target = tmp_path / "site"
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", *isolation, "--target", str(target), str(pkg)],
        check=True,
    )
    (tmp_path / "recipe.yaml").write_text(
        textwrap.dedent("""
        algorithm:
          estimator: {name: centered_times, scale: 3.0}
    """)
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
    used = subprocess.run([sys.executable, "-c", USE], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert used.returncode == 0, used.stderr
    assert used.stdout.split()[:2] == ["centered_times", "3.0"]
    assert "[1.5, -1.5, 1.5, -1.5]" in used.stdout
    listed = subprocess.run(
        [sys.executable, "-m", "grpo_zoo.cli", "list", "estimators"], env=env, capture_output=True, text=True
    )
    assert "centered_times" in listed.stdout and "test plug-in" in listed.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm:\n  estimator: {name: centered_times, scal: 3.0}\n")
    validated = subprocess.run(
        [sys.executable, "-m", "grpo_zoo.cli", "validate", str(bad)], env=env, capture_output=True, text=True
    )
    assert validated.returncode == 1 and "Did you mean 'scale'?" in validated.stdout
