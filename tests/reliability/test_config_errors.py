"""User errors in the recipe or on the command line (issue #7): every one is caught before the
model loads, with a message that names the field and says what to change; the CLI prints it
on one line (exit code 2), never a traceback.
"""

from __future__ import annotations

import pytest

import grpo_zoo.policy
from grpo_zoo.cli import main
from grpo_zoo.config import load_config
from grpo_zoo.configuration import ConfigError
from grpo_zoo.trainer import train


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if anything tries to load a model: the error must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the config error was reported")

    monkeypatch.setattr(grpo_zoo.policy.Policy, "from_pretrained", classmethod(refuse))


@pytest.fixture
def no_answer_data(tmp_path, h):
    return h.write_jsonl(tmp_path / "qa.jsonl", [{"problem": "1 + 1?", "solution": "2"}] * 3)


CASES = {
    "missing model path": (["model.path={tmp}/no-model"], r"model.path '.*no-model' is not a local Hugging Face"),
    "dataset path missing": (["data.train={tmp}/nothing.jsonl"], r"data.train '.*nothing.jsonl' does not exist"),
    "dataset without the answer column": (["data.train={data}"], r"no column 'answer'.*set data.answer_key"),
    "group of one": (["rollout.group_size=1"], r"rollout.group_size = 1.*set rollout.group_size >= 2"),
    "mini batch not dividing the batch": (
        ["train.mini_batch_size=3"],
        r"batch of 8 responses \(2 train.questions_per_step x 4 rollout.group_size\) is not divisible by "
        r"train.mini_batch_size = 3; set train.mini_batch_size to a divisor of 8 \(e.g. 2\)",
    ),
    "mini batch with diva variants": (
        ["algorithm.selector=diva", "train.mini_batch_size=12"],
        r"batch of 16 responses .*num_variants.*divisor of 16 \(e.g. 8\)",
    ),
    "micro batch not dividing the mini batch": (
        ["train.mini_batch_size=4", "train.micro_batch_size=3"], r"micro_batch_size = 3; choose a micro batch"
    ),
    "micro batch not dividing the batch": (["train.micro_batch_size=3"], r"train.micro_batch_size = 3"),
    "reward weights above R_max": (
        ["reward.functions=[{name: accuracy, weight: 0.9}, {name: format, weight: 0.5}]"],
        r"weights sum to 1.4 > reward.reward_max",
    ),
    "reward that cannot be imported": (
        ["reward.functions=[{name: accuracy, weight: 0.5}, {name: 'no_such_module_xyz:score', weight: 0.5}]"],
        r"'no_such_module_xyz:score' cannot be imported",
    ),
    "reward time limit": (["reward.timeout_s=0"], r"reward.timeout_s must be a positive"),
    "template without the problem": (["data.prompt_template=Solve it."], r"data.prompt_template must contain"),
    "bad share": (["data.max_bad_row_share=5"], r"data.max_bad_row_share must be a share in \[0, 1\]"),
    "top_p": (["rollout.top_p=0"], r"rollout.top_p must be in \(0, 1\]"),
    "lr": (["train.lr=0"], r"train.lr must be a positive number"),
    "prompt length": (["data.max_prompt_length=0"], r"data.max_prompt_length must be >= 1"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_user_errors_are_caught_before_the_model_loads(case, h, tmp_path, no_answer_data, tiny_model, no_model_load):
    extra = [o.replace("{tmp}", str(tmp_path)).replace("{data}", str(no_answer_data)) for o in CASES[case][0]]
    overrides = h.tiny_overrides(tiny_model, tmp_path / "run", *extra)
    with pytest.raises(ConfigError, match=CASES[case][1]):
        train(load_config(None, overrides), recipe="bad")


def test_too_few_questions_for_a_step(h, tmp_path, tiny_model):
    data = h.write_jsonl(tmp_path / "qa.jsonl", [{"problem": "1 + 1?", "answer": "2"}] * 3)
    overrides = h.tiny_overrides(tiny_model, tmp_path / "run", f"data.train={data}", "train.questions_per_step=4")
    with pytest.raises(ConfigError, match=r"questions_per_step = 4 but data.train .* has only 3 usable questions"):
        train(load_config(None, overrides), recipe="bad")


def test_cli_prints_one_line_and_exits_2(h, tmp_path, tiny_model, capsys, no_model_load):
    code = main(["train", *h.tiny_overrides(tiny_model, tmp_path / "run", "rollout.group_size=1")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "grpo-zoo train: error: rollout.group_size = 1" in err


def test_cli_strict_flag_sets_data_strict(h, tmp_path, tiny_model, capsys, no_model_load):
    rows = [{"problem": "q", "answer": "1"}] * 30 + [{"problem": "q", "answer": ""}]
    data = h.write_jsonl(tmp_path / "qa.jsonl", rows)
    args = h.tiny_overrides(tiny_model, tmp_path / "run", f"data.train={data}")
    assert main(["train", *args, "--strict"]) == 2
    assert "row 30: empty answer" in capsys.readouterr().err


def test_validate_catches_cross_field_errors(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("rollout:\n  group_size: 1\n")
    assert main(["validate", str(recipe)]) == 1
    assert "rollout.group_size >= 2" in capsys.readouterr().out


@pytest.mark.parametrize("extra", [[], ["train.mini_batch_size=8"]])
def test_a_micro_batch_larger_than_the_batch_is_the_whole_batch(h, tmp_path, tiny_model, extra):
    """The testbed recipes train 32 responses per micro-batch; asking for a batch of 16 (or a mini
    batch of 8) on the command line must not trip the divisibility check."""
    from pathlib import Path

    from grpo_zoo.run import check_config

    recipe = Path(__file__).resolve().parents[2] / "configs" / "testbed" / "diva.yaml"
    cfg = load_config(recipe, h.tiny_overrides(tiny_model, tmp_path / "run", *extra))
    assert cfg.train.micro_batch_size == 32
    check_config(cfg, environment=False)
