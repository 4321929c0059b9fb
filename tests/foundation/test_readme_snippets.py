"""The README's code blocks are what a user copies first: its YAML must validate and its plug-in must register."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from grpo_zoo.config import load_config

README = Path(__file__).resolve().parents[2] / "README.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("snippet", blocks("yaml"))
def test_readme_yaml_validates(snippet, tmp_path):
    path = tmp_path / "snippet.yaml"
    path.write_text(snippet)
    cfg = load_config(path)
    for slot, spec in yaml.safe_load(snippet).get("algorithm", {}).items():
        chosen = getattr(cfg.algorithm, slot)
        assert chosen.name == spec["name"]
        for key, value in spec.items():
            if key != "name":
                assert getattr(chosen.config, key) == value, (slot, key)


def test_readme_plugin_registers_and_runs():
    from grpo_zoo.registry import ESTIMATORS
    from grpo_zoo.types import AdvantageInputs

    (code,) = blocks("python")
    ESTIMATORS.load()  # the built-ins first, as a user's import would find them
    try:
        exec(compile(code, str(README), "exec"), {})
        entry = ESTIMATORS.get("my_estimator")
        rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
        inputs = AdvantageInputs(rewards=rewards, prompt_ids=torch.zeros(4, dtype=torch.long),
                                 question_ids=torch.zeros(4, dtype=torch.long), response_mask=torch.ones(4, 3))
        out = entry.obj(inputs, entry.config_cls(scale=2.0))
        torch.testing.assert_close(out.advantages, torch.tensor([1.0, -1.0, 1.0, -1.0]))
    finally:
        ESTIMATORS._entries.pop("my_estimator", None)  # leave the registry as other tests expect it
