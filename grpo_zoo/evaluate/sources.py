"""What `grpo-zoo eval` is given: models and datasets as `[LABEL=]PATH`, and which recipe applies.

A grpo_zoo run directory holds config.yaml (the recipe it trained with) next to checkpoints/;
a model given as the run, a step-N checkpoint or its policy/ directory is traced back to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpo_zoo.config import Config, load_config


@dataclass
class Source:
    """A model or dataset as given on the command line: `PATH` or `LABEL=PATH`."""

    label: str
    path: str


def parse_sources(values: list[str], kind: str) -> list[Source]:
    """`LABEL=PATH` or `PATH` each; default labels are short and made unique (a second `x` becomes `x#2`)."""
    out: list[Source] = []
    for value in values:
        head, sep, tail = value.partition("=")
        labelled = sep and head and "/" not in head and not Path(value).expanduser().exists()
        label, path = (head, tail) if labelled else (_default_label(value, kind), value)
        taken = {s.label for s in out}
        unique, n = label, 2
        while unique in taken:
            unique, n = f"{label}#{n}", n + 1
        out.append(Source(unique, path))
    return out


def _default_label(value: str, kind: str) -> str:
    if value == "testbed":
        return value
    p = Path(value).expanduser()
    if kind == "data":
        return p.stem if p.is_file() else p.name
    p = p.parent if p.name == "policy" else p
    if (p / "checkpoints").is_dir():  # a run directory: it is evaluated at its latest checkpoint
        from grpo_zoo.checkpoint import latest_checkpoint

        p = latest_checkpoint(p) or p
    if p.name.startswith("step-") and p.parent.name == "checkpoints":
        return f"{p.parent.parent.name}/{p.name}"  # run/step-000100
    return p.name or value


def run_recipe(model: str) -> Path | None:
    """The config.yaml of the grpo_zoo run that `model` (a run, checkpoint or its policy/ dir) belongs to."""
    if model == "testbed":
        return None
    p = Path(model).expanduser().resolve()
    for run in [p, *list(p.parents)[:3]]:  # policy -> step-N -> checkpoints -> run
        inside = run == p or run / "checkpoints" in [p, *p.parents]
        if inside and (run / "config.yaml").is_file() and (run / "checkpoints").is_dir():
            return run / "config.yaml"
    return None


def pick_recipe(models: list[Source], config: str | None, default: Path) -> tuple[Path, list[Path]]:
    """(recipe to use, the run recipes of the models): --config, else the first run's, else `default`."""
    runs = [r for r in (run_recipe(m.path) for m in models) if r is not None]
    if config:
        return Path(config), runs
    return (runs[0] if runs else default), runs


def recipe_warnings(cfg: Config, runs: list[Path], overrides: list[str]) -> list[str]:
    """A warning per model run whose template, system prompt or reward differ from the recipe used."""
    def key(c: Config) -> tuple:
        return (c.data.prompt_template, c.data.system_prompt, [(f.name, f.weight) for f in c.reward.functions],
                c.reward.accuracy_function)

    out = []
    for path in runs:
        other = load_config(path, overrides)
        if key(other) != key(cfg):
            out.append(f"{path} trained with another prompt template, system prompt or reward than the one "
                       f"used here (template {other.data.prompt_template!r}, reward "
                       f"{[f.name for f in other.reward.functions]}); pass --config {path} to use its own")
    return out


__all__ = ["Source", "parse_sources", "pick_recipe", "recipe_warnings", "run_recipe"]
