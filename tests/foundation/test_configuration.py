from dataclasses import dataclass, field
from typing import Literal

import pytest

from grpo_zoo.config import Config, load_config
from grpo_zoo.configuration import ConfigError, apply_overrides, build, read_yaml, to_dict


@dataclass
class _Inner:
    rate: float = 0.1  # a float
    mode: Literal["a", "b"] = "a"


@dataclass
class _Outer:
    steps: int = 3
    name: str = "x"
    flag: bool = False
    tags: list[str] = field(default_factory=list)
    inner: _Inner = field(default_factory=_Inner)
    maybe: int | None = None


def test_build_nested_and_coerce():
    obj = build(_Outer, {"steps": 5, "inner": {"rate": 1, "mode": "b"}, "tags": ["p"], "maybe": None})
    assert obj.steps == 5 and obj.inner.rate == 1.0 and isinstance(obj.inner.rate, float)
    assert obj.inner.mode == "b" and obj.tags == ["p"] and obj.maybe is None
    assert build(_Outer, {"inner": {"rate": "1e-6"}}).inner.rate == 1e-6  # YAML reads 1e-6 as a string


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"stesp": 1}, "unknown key 'stesp'. Did you mean 'steps'?"),
        ({"inner": {"rat": 1}}, "unknown key 'inner.rat'. Did you mean 'rate'?"),
        ({"steps": "many"}, "'steps' must be an integer, got str 'many'"),
        ({"flag": "yes"}, "'flag' must be true or false"),
        ({"inner": {"mode": "c"}}, "'inner.mode' must be one of ['a', 'b']"),
        ({"tags": "p"}, "'tags' must be a list"),
        ({"inner": 3}, "inner: expected a mapping"),
    ],
)
def test_errors_name_the_key(data, expected):
    with pytest.raises(ConfigError) as info:
        build(_Outer, data)
    assert expected in str(info.value)


def test_overrides():
    data = apply_overrides(
        {"a": {"b": 1}, "est": {"name": "diva", "k": 0.2}}, ["a.b=2", "a.c=[1, 2]", "est=grpo", "x.y=z"]
    )
    assert data == {"a": {"b": 2, "c": [1, 2]}, "est": {"name": "grpo"}, "x": {"y": "z"}}
    assert apply_overrides({"est": "grpo"}, ["est.eps=0.1"]) == {"est": {"name": "grpo", "eps": 0.1}}
    with pytest.raises(ConfigError, match="key.sub=value"):
        apply_overrides({}, ["novalue"])


def test_plugin_slot_takes_name_or_mapping():
    cfg = load_config(None, ["algorithm.estimator=rloo", "algorithm.loss.name=dapo"])
    assert cfg.algorithm.estimator.name == "rloo"
    assert cfg.algorithm.loss.name == "dapo"
    assert cfg.algorithm.loss.config is not None


def test_unknown_plugin_and_plugin_option(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(None, ["algorithm.estimator=gpro"])
    assert "unknown estimator 'gpro'" in str(info.value) and "Did you mean 'grpo'?" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(None, ["algorithm.estimator.name=diva", "algorithm.estimator.kk=1"])
    assert "algorithm.estimator.kk" in str(info.value)


def test_yaml_files_and_base(tmp_path):
    (tmp_path / "base.yaml").write_text("train:\n  steps: 7\n  lr: 1e-5\nalgorithm:\n  estimator: {name: diva}\n")
    (tmp_path / "child.yaml").write_text("base: base.yaml\ntrain:\n  steps: 9\nalgorithm:\n  estimator: grpo\n")
    cfg = load_config(tmp_path / "child.yaml")
    assert cfg.train.steps == 9 and cfg.train.lr == 1e-5 and cfg.algorithm.estimator.name == "grpo"
    round_trip = build(Config, to_dict(cfg))
    assert to_dict(round_trip) == to_dict(cfg)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        read_yaml(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("train:\n  steps: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        read_yaml(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        read_yaml(tmp_path / "list.yaml")


def test_unknown_reward_function():
    with pytest.raises(ConfigError, match="unknown reward 'acuracy'"):
        load_config(None, ["reward.functions=[{name: acuracy, weight: 1.0}]", "reward.accuracy_function=acuracy"])
