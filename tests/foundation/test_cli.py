import glob
from pathlib import Path

import pytest

from grpo_zoo.cli import default_recipe, main

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(glob.glob(str(ROOT / "configs" / "**" / "*.yaml"), recursive=True))


def test_every_shipped_config_validates(capsys):
    assert SHIPPED, "no recipes under configs/"
    assert main(["validate", *SHIPPED]) == 0, capsys.readouterr().out


def test_default_recipe_is_diva_on_testbed():
    from grpo_zoo.config import load_config

    cfg = load_config(default_recipe())
    assert cfg.algorithm.estimator.name == "diva" and cfg.algorithm.selector.name == "diva"
    assert cfg.model.path == "testbed" and cfg.data.train == "testbed"


def test_list_prints_every_kind(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for title in ("estimators:", "selectors:", "losses:", "rewards:"):
        assert title in out
    assert "diva" in out and "ppo_clip" in out and "accuracy" in out


@pytest.mark.parametrize(
    "content, expected",
    [
        ("algorithm:\n  estimator: grpoo\n", "unknown estimator 'grpoo'. Did you mean 'grpo'?"),
        ("trian:\n  steps: 3\n", "unknown key 'trian'. Did you mean 'train'?"),
        ("train:\n  steps: lots\n", "'train.steps' must be an integer"),
        ("train: [1\n", "not valid YAML"),
    ],
)
def test_bad_configs_give_one_paragraph(tmp_path, capsys, content, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert expected in out and "Traceback" not in out and len(out.strip().splitlines()) == 1


def test_missing_file(capsys):
    assert main(["validate", "no/such/file.yaml"]) == 1
    assert "does not exist" in capsys.readouterr().out


def test_train_error_is_one_line(capsys, tmp_path):
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err
