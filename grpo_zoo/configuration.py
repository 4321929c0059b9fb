"""Typed dataclass configs from YAML, with `key.sub=value` overrides and clear errors.

`build(cls, data)` turns a plain dict into a dataclass tree, checking every key and type.
A field whose metadata names a registry is a plug-in slot: its YAML value is the plug-in's
name, or a mapping with `name:` plus that plug-in's own options, checked against the
plug-in's config dataclass.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from grpo_zoo.registry import Registry, RegistryError, closest


class ConfigError(ValueError):
    """A config problem, with a message that says which key and what to change."""


@dataclass
class PluginSpec:
    """A plug-in chosen by name, with its own config dataclass instance."""

    name: str
    config: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **(dataclasses.asdict(self.config) if self.config is not None else {})}


def plugin(registry: Registry, default: str) -> Any:
    """A dataclass field holding a PluginSpec resolved against `registry`."""
    return field(default=default, metadata={"registry": registry})  # resolved by build()


# ---------------------------------------------------------------------------------------
# Building dataclasses from dicts
# ---------------------------------------------------------------------------------------


def build(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass `cls` from `data` (a mapping), validating keys and types."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping of {cls.__name__} options, got {_show(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        hint = closest(str(key), list(fields))
        did_you_mean = f" Did you mean '{hint}'?" if hint else ""
        raise ConfigError(
            f"unknown key '{_join(where, key)}'.{did_you_mean} Valid keys of {where or 'the config'}: "
            f"{', '.join(fields)}."
        )
    kwargs = {}
    for name, f in fields.items():
        key = _join(where, name)
        registry = f.metadata.get("registry")
        if registry is not None:
            kwargs[name] = build_plugin(registry, data.get(name, f.default), key)
        elif name in data:
            kwargs[name] = _coerce(hints[name], data[name], key)
        elif dataclasses.is_dataclass(hints[name]):
            kwargs[name] = build(hints[name], {}, key)  # so plug-in defaults inside resolve too
    try:
        obj = cls(**kwargs)
    except (ValueError, TypeError) as exc:  # a __post_init__ check in the dataclass
        raise ConfigError(f"{where or 'config'}: {exc}") from None
    return obj


def build_plugin(registry: Registry, value: Any, where: str) -> PluginSpec:
    if isinstance(value, PluginSpec):
        return value
    if isinstance(value, str):
        name, options = value, {}
    elif isinstance(value, dict) and isinstance(value.get("name"), str):
        options = dict(value)
        name = options.pop("name")
    else:
        raise ConfigError(
            f"'{where}' must be a {registry.kind} name or a mapping with 'name:' and its options, "
            f"got {_show(value)}. Known {registry.kind}s: {', '.join(registry.names())}."
        )
    try:
        entry = registry.get(name)
    except RegistryError as exc:
        raise ConfigError(f"'{where}': {exc}") from None
    return PluginSpec(name, build(entry.config_cls, options, where))


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """Check `value` against the type hint `tp` (converting where YAML is loose); raise ConfigError."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _coerce_union(tp, value, where)
    if origin is Literal:
        return _coerce_literal(typing.get_args(tp), value, where)
    if origin in (list, tuple, dict):
        return _coerce_container(tp, value, where)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, where)
    scalar = _SCALARS.get(tp)
    return scalar(value, where) if scalar else value


def _coerce_union(tp: Any, value: Any, where: str) -> Any:
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(arg, value, where)
        except ConfigError as exc:
            errors.append(str(exc))
    raise ConfigError(errors[0] if len(errors) == 1 else f"'{where}': {_show(value)} fits none of {tp}")


def _coerce_literal(choices: tuple, value: Any, where: str) -> Any:
    if value in choices:
        return value
    hint = closest(str(value), [str(a) for a in choices])
    did_you_mean = f" Did you mean '{hint}'?" if hint else ""
    raise ConfigError(f"'{where}' must be one of {list(choices)}, got {_show(value)}.{did_you_mean}")


def _coerce_container(tp: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"'{where}' must be a mapping, got {_show(value)}")
        vt = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(vt, v, f"{where}.{k}") for k, v in value.items()}
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"'{where}' must be a list, got {_show(value)}")
    item = args[0] if args else Any
    items = [_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    return items if origin is list else tuple(items)


def _to_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"'{where}' must be true or false, got {_show(value)}")


def _to_int(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ConfigError(f"'{where}' must be an integer, got {_show(value)}")


def _to_float(value: Any, where: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):  # YAML reads 1e-6 (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    raise ConfigError(f"'{where}' must be a number, got {_show(value)}")


def _to_str(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    raise ConfigError(f"'{where}' must be a string, got {_show(value)}")


_SCALARS = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}


def _join(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def _show(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


# ---------------------------------------------------------------------------------------
# YAML files and command-line overrides
# ---------------------------------------------------------------------------------------


def read_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML config; a top-level `base: other.yaml` is merged underneath it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist; check the path (relative paths start at {Path.cwd()})")
    if path.resolve() in _seen:
        raise ConfigError(f"config '{path}' includes itself through 'base:'")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"config '{path}' is not valid YAML{at}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config '{path}' must be a mapping of sections, got {_show(data)}")
    base = data.pop("base", None)
    if base is None:
        return data
    merged = read_yaml(path.parent / base, _seen + (path.resolve(),))
    return deep_merge(merged, data)


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and not _is_rename(out[key], value):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _is_rename(old: dict[str, Any], new: dict[str, Any]) -> bool:
    # Choosing another plug-in by name drops the old one's options rather than mixing them.
    return "name" in new and "name" in old and new["name"] != old["name"]


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` strings (value parsed as YAML) to a nested dict."""
    data = dict(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like key.sub=value (e.g. train.steps=20)")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        parts = key.strip().split(".")
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if isinstance(child, str):  # `estimator: grpo` gains options
                child = {"name": child}
            elif not isinstance(child, dict):
                child = {}
            node[part] = child = dict(child)
            node = child
        last = parts[-1]
        if isinstance(node.get(last), dict) and isinstance(value, str) and "name" in node[last]:
            node[last] = {"name": value}  # `algorithm.estimator=grpo` picks another plug-in
        else:
            node[last] = value
    return data


def to_dict(obj: Any) -> Any:
    """A config tree back to plain data (PluginSpecs as name + options)."""
    if isinstance(obj, PluginSpec):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
