"""The `grpo-zoo` command line: train, validate, list (and the subcommands later issues add)."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from grpo_zoo.configuration import ConfigError
from grpo_zoo.registry import ALL_REGISTRIES, RegistryError

DEFAULT_RECIPE = "testbed/diva.yaml"


def default_recipe() -> Path:
    """The recipe `grpo-zoo train` runs with no arguments: DIVA-GRPO on the testbed."""
    return Path(str(resources.files("grpo_zoo.configs").joinpath(DEFAULT_RECIPE)))


def cmd_train(args: argparse.Namespace) -> int:
    from grpo_zoo.config import load_config
    from grpo_zoo.trainer import train

    overrides = list(args.overrides)
    if args.config and "=" in args.config and not Path(args.config).exists():
        overrides.insert(0, args.config)  # `grpo-zoo train train.steps=5`: an override, not a file
        args.config = None
    path = Path(args.config) if args.config else default_recipe()
    cfg = load_config(path, overrides)
    result = train(cfg, recipe=path.stem, resume=args.resume, output_dir=args.output_dir)
    print(result.summary())
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from grpo_zoo.config import load_config

    failed = 0
    for path in args.files:
        try:
            cfg = load_config(path, args.overrides)
        except ConfigError as exc:
            failed += 1
            print(f"FAIL {path}: {exc}")
            continue
        algo = cfg.algorithm
        print(f"ok   {path}: estimator={algo.estimator.name} selector={algo.selector.name} loss={algo.loss.name}")
    return 1 if failed else 0


def cmd_list(args: argparse.Namespace) -> int:
    for title, registry in ALL_REGISTRIES.items():
        if args.kind and args.kind != title:
            continue
        print(f"{title}:")
        for entry in registry.entries():
            print(f"  {entry.name:<24} {entry.description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo-zoo",
        description="GRPO-family RL for (multimodal) language models: DIVA-GRPO and its baselines on one engine.",
    )
    sub = parser.add_subparsers(dest="command")

    train = sub.add_parser("train", help="train a policy from a recipe (default: DIVA-GRPO on the testbed)")
    train.add_argument("config", nargs="?", help=f"recipe YAML (default: the packaged {DEFAULT_RECIPE})")
    train.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. train.steps=20")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    train.add_argument("--output-dir", help="where logs and checkpoints go (default: output.dir of the recipe)")
    train.set_defaults(func=cmd_train)

    validate = sub.add_parser("validate", help="dry-run recipes: build every config without loading a model")
    validate.add_argument("files", nargs="+", help="recipe YAML files")
    validate.add_argument("--set", dest="overrides", action="append", default=[], help="key.sub=value override")
    validate.set_defaults(func=cmd_validate)

    lister = sub.add_parser("list", help="list every registered estimator, selector, loss and reward")
    lister.add_argument("kind", nargs="?", choices=sorted(ALL_REGISTRIES), help="only this kind")
    lister.set_defaults(func=cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (ConfigError, RegistryError) as exc:
        print(f"grpo-zoo {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
