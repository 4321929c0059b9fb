from dataclasses import dataclass

import pytest

from grpo_zoo.registry import ALL_REGISTRIES, ESTIMATORS, Registry, RegistryError


@dataclass
class _Cfg:
    scale: float = 1.0  # test option


def _fresh() -> Registry:
    # A private registry: tests never clear the global ones.
    return Registry("widget", "grpo_zoo.test_widgets")


def test_register_and_get():
    reg = _fresh()

    @reg.register("alpha", config=_Cfg, description="first widget")
    def alpha():
        return 1

    entry = reg.get("alpha")
    assert entry.obj is alpha and entry.config_cls is _Cfg and entry.description == "first widget"
    assert reg.names() == ["alpha"] and "alpha" in reg


def test_duplicate_name_is_an_error():
    reg = _fresh()
    reg.register("alpha")(lambda: 1)
    with pytest.raises(RegistryError, match="registered twice"):
        reg.register("alpha")(lambda: 2)


def test_unknown_name_lists_known_and_closest():
    reg = _fresh()
    for name in ("grpo", "dr_grpo", "rloo"):
        reg.register(name)(lambda: 0)
    with pytest.raises(RegistryError) as info:
        reg.get("gpro")
    message = str(info.value)
    assert "Did you mean 'grpo'?" in message
    assert "dr_grpo, grpo, rloo" in message
    assert "grpo_zoo.test_widgets" in message  # says where third-party plug-ins come from


def test_config_must_be_a_dataclass():
    with pytest.raises(TypeError, match="dataclass"):
        _fresh().register("x", config=dict)


def test_alias_shares_object():
    reg = _fresh()
    fn = reg.register("base", config=_Cfg)(lambda: 0)
    reg.alias("other", "base")
    assert reg.get("other").obj is fn and reg.get("other").config_cls is _Cfg


def test_builtin_registries_are_populated():
    for kind, registry in ALL_REGISTRIES.items():
        assert registry.names(), f"no built-in {kind}"
    assert "grpo" in ESTIMATORS and "diva" in ESTIMATORS
