"""Name -> plug-in registries, one per kind, extended by entry points.

Built-in plug-ins register with a decorator when their module is imported; third-party
packages declare an entry point in one of the groups below whose value is a module (or any
object) to import, and importing it registers the plug-in the same way.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown or duplicate plug-in name. str() is the whole message, not a repr."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T  # the function (estimator, loss, reward) or class (selector)
    config_cls: type  # the plug-in's own config dataclass
    description: str
    module: str


@dataclasses.dataclass
class EmptyConfig:
    """A plug-in with no options."""


def closest(name: str, known: list[str]) -> str | None:
    matches = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return matches[0] if matches else None


class Registry(Generic[T]):
    """A named collection of plug-ins of one kind.

    Duplicate names are an error; an unknown name raises RegistryError listing the known
    names and the closest match. Plug-ins from entry points load on first lookup.
    """

    def __init__(self, kind: str, entry_point_group: str, builtin_modules: tuple[str, ...] = ()):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._builtin_modules = builtin_modules
        self._entries: dict[str, Entry[T]] = {}
        self._loaded = False

    def register(self, name: str, *, config: type | None = None, description: str = "") -> Callable[[T], T]:
        config_cls = config or EmptyConfig
        if not dataclasses.is_dataclass(config_cls):
            raise TypeError(f"{self.kind} '{name}': config must be a dataclass, got {config_cls!r}")

        def decorator(obj: T) -> T:
            self.add(name, obj, config_cls, description or _first_doc_line(obj))
            return obj

        return decorator

    def add(self, name: str, obj: T, config_cls: type, description: str) -> None:
        if name in self._entries:
            previous = self._entries[name].module
            raise RegistryError(
                f"{self.kind} '{name}' is registered twice (first by {previous}, again by "
                f"{getattr(obj, '__module__', '?')}); rename one of them"
            )
        self._entries[name] = Entry(name, obj, config_cls, description, getattr(obj, "__module__", "?"))

    def alias(self, name: str, target: str, *, config: type | None = None, description: str = "") -> None:
        """Register `name` for the same object as `target`, optionally with other defaults."""
        entry = self._entries[target]
        self.add(name, entry.obj, config or entry.config_cls, description or f"alias of {target}")

    def load(self) -> None:
        """Import the built-in modules and every installed entry point, once."""
        if self._loaded:
            return
        for module in self._builtin_modules:
            importlib.import_module(module)
        self._loaded = True
        for ep in entry_points(group=self.entry_point_group):
            if ep.name in self._entries:
                continue
            try:
                loaded = ep.load()
            except Exception as exc:  # a broken third-party package must not kill the run
                log.warning("could not load %s plug-in '%s' (%s): %s", self.kind, ep.name, ep.value, exc)
                continue
            if ep.name not in self._entries and callable(loaded):
                # An entry point may name the plug-in object itself rather than a module.
                self.add(ep.name, loaded, EmptyConfig, _first_doc_line(loaded))

    def get(self, name: str) -> Entry[T]:
        self.load()
        if name not in self._entries:
            known = sorted(self._entries)
            hint = closest(name, known)
            did_you_mean = f" Did you mean '{hint}'?" if hint else ""
            raise RegistryError(
                f"unknown {self.kind} '{name}'.{did_you_mean} Known {self.kind}s: {', '.join(known)}. "
                f"Third-party {self.kind}s register through the '{self.entry_point_group}' entry-point group."
            )
        return self._entries[name]

    def names(self) -> list[str]:
        self.load()
        return sorted(self._entries)

    def entries(self) -> list[Entry[T]]:
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: str) -> bool:
        self.load()
        return name in self._entries


def _first_doc_line(obj: Any) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


ESTIMATORS: Registry = Registry("estimator", "grpo_zoo.estimators", ("grpo_zoo.algorithms",))
LOSSES: Registry = Registry("loss", "grpo_zoo.losses", ("grpo_zoo.algorithms",))
SELECTORS: Registry = Registry("selector", "grpo_zoo.samplers", ("grpo_zoo.samplers",))
REWARDS: Registry = Registry("reward", "grpo_zoo.rewards", ("grpo_zoo.rewards",))

ALL_REGISTRIES = {"estimators": ESTIMATORS, "selectors": SELECTORS, "losses": LOSSES, "rewards": REWARDS}
