"""The `grpo-zoo` command line: train, validate, list, bench (and the subcommands later issues add)."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from grpo_zoo.configuration import ConfigError
from grpo_zoo.registry import ALL_REGISTRIES, RegistryError

DEFAULT_RECIPE = "default.yaml"
AUDIT_HELP = """\
Sample G responses for a seeded subset of the training questions with the recipe's prompt
template, sampling and reward, and report: all-wrong / mixed / all-right groups, the success
histogram, greedy and sampled pass@1, pass@k; the same on every variant kind the diva selector
can build (hint depths, paraphrase, each image perturbation, only-vision) with a verdict per
kind; Durian's visual entropy and confidence against accuracy; how often a run revisits each
question; and which methods the findings favour or warn against. Writes audit.json, audit.md
and audit.png.

Verdict: paired bootstrap 95% CI of (variant - original) sampled pass@1 on the same questions:
above 0 "easier", below 0 "harder", else "same"; "inverted" when against the kind's intent
(hint: easier; perturbations and only-vision: harder; paraphrase: same).

Cost: (questions + kinds x variant-questions) x (G + 1) sequences. The defaults on the testbed
(512 + ~10 x 128 questions, G = 8: ~16k sequences) take ~3 min on 2 CPU cores; for a quick look
use --questions 128 --variant-questions 32. Runs on the GPU when there is one (model.device).
"""


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
    if args.strict:
        cfg.data.strict = True
    result = train(cfg, recipe=path.stem, resume=args.resume, output_dir=args.output_dir)
    print(result.summary())
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from grpo_zoo.bench import is_bench_file, validate_bench
    from grpo_zoo.config import load_config
    from grpo_zoo.run import check_config

    failed = 0
    for path in expand_paths(args.files):
        try:
            if is_bench_file(path):
                print(f"ok   {path}: {validate_bench(path, args.overrides)}")
                continue
            cfg = load_config(path, args.overrides)
            check_config(cfg, environment=False)  # cross-field errors (G, batch sizes, rewards) too
        except ConfigError as exc:
            failed += 1
            print(f"FAIL {path}: {exc}")
            continue
        algo = cfg.algorithm
        print(f"ok   {path}: estimator={algo.estimator.name} selector={algo.selector.name} loss={algo.loss.name}")
    return 1 if failed else 0


def expand_paths(paths: list[str]) -> list[str]:
    """Files as given; a directory stands for every YAML file under it."""
    out: list[str] = []
    for path in paths:
        p = Path(path)
        out.extend(sorted(str(f) for f in p.rglob("*.yaml")) if p.is_dir() else [path])
    return out


def cmd_list(args: argparse.Namespace) -> int:
    for title, registry in ALL_REGISTRIES.items():
        if args.kind and args.kind != title:
            continue
        print(f"{title}:")
        for entry in registry.entries():
            print(f"  {entry.name:<24} {entry.description}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from grpo_zoo.bench import run_bench

    try:
        result = run_bench(args.config, args.overrides, output_dir=args.output_dir, parallel=args.parallel,
                           threads=args.threads, ray=args.ray or bool(args.address), address=args.address,
                           report_only=args.report_only, dry_run=args.dry_run)
    except KeyboardInterrupt:
        print("grpo-zoo bench: interrupted; finished trials are kept, rerun the same command to continue",
              file=sys.stderr)
        return 130
    return 1 if result.failed else 0


def cmd_audit(args: argparse.Namespace) -> int:
    from grpo_zoo.audit import run_cli

    return run_cli(args, default_recipe())


def cmd_eval(args: argparse.Namespace) -> int:
    from grpo_zoo.evaluate import run_cli

    return run_cli(args, default_recipe())


def cmd_augment(args: argparse.Namespace) -> int:
    from grpo_zoo.augment.cli import run_cli

    return run_cli(args)


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
    train.add_argument("--strict", action="store_true",
                       help="stop at the first bad dataset row instead of skipping it (sets data.strict)")
    train.set_defaults(func=cmd_train)

    validate = sub.add_parser("validate", help="dry-run recipes: build every config without loading a model")
    validate.add_argument("files", nargs="+", help="recipe or bench YAML files, or directories of them")
    validate.add_argument("--set", dest="overrides", action="append", default=[], help="key.sub=value override")
    validate.set_defaults(func=cmd_validate)

    lister = sub.add_parser("list", help="list every registered estimator, selector, loss and reward")
    lister.add_argument("kind", nargs="?", choices=sorted(ALL_REGISTRIES), help="only this kind")
    lister.set_defaults(func=cmd_list)

    bench = sub.add_parser("bench", help="run a (recipe x seed) benchmark matrix and write its report (resumable)")
    bench.add_argument("config", help="bench YAML, e.g. configs/bench/testbed.yaml")
    bench.add_argument("overrides", nargs="*", help="key.sub=value overrides for every trial, e.g. model.path=DIR")
    bench.add_argument("--output-dir", help="where trials and the report go (default: output_dir of the bench file)")
    bench.add_argument("--parallel", type=int, help="trials at once (default: the bench file's, usually 1)")
    bench.add_argument("--threads", type=int, help="torch threads per trial (default: cores // parallel)")
    bench.add_argument("--ray", action="store_true", help="run trials as Ray tasks (pip install -e .[ray])")
    bench.add_argument("--address", help="a Ray cluster address (implies --ray; needs a shared filesystem)")
    bench.add_argument("--report-only", action="store_true", help="run nothing; rewrite the report")
    bench.add_argument("--dry-run", action="store_true", help="check the configs and print the trials still to run")
    bench.set_defaults(func=cmd_bench)

    audit = sub.add_parser(
        "audit", help="check a model + dataset against the premises of the methods (groups, variants, Durian)",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=AUDIT_HELP,
    )
    audit.add_argument("--model", help="HF dir, grpo_zoo run/checkpoint dir, or `testbed` (default: model.path)")
    audit.add_argument("--data", help="dataset file/dir or `testbed` (default: the recipe's data.train)")
    audit.add_argument("--config", help=f"recipe YAML: template, sampling, reward, run length ({DEFAULT_RECIPE})")
    audit.add_argument("--set", dest="overrides", action="append", default=[], help="key.sub=value recipe override")
    audit.add_argument("--out", help="report directory (default: runs/audit-<time>)")
    audit.add_argument("--questions", type=int, default=512, help="originals audited (default 512)")
    audit.add_argument("--variant-questions", type=int, default=128, help="questions per variant kind (default 128)")
    audit.add_argument("--group-size", type=int, default=0, help="G (default: the recipe's rollout.group_size)")
    audit.add_argument("--seed", type=int, default=0, help="subset and sampling seed (default 0)")
    audit.add_argument("--batch-size", type=int, default=0, help="sequences per generate call (eval.batch_size)")
    audit.add_argument("--kinds", help="comma-separated kinds or families to audit, e.g. hint,perturb_noise")
    audit.add_argument("--perturb-strength", type=float, default=0.45, help="strength of each perturbation (0.45)")
    audit.add_argument("--no-greedy", action="store_true", help="skip the greedy response per question")
    audit.add_argument("--no-durian", action="store_true", help="skip visual entropy and confidence")
    audit.add_argument("--no-progress", action="store_true", help="no progress bar")
    audit.add_argument("--threads", type=int, help="torch CPU threads (default: torch's; 1 is best on a busy machine)")
    audit.set_defaults(func=cmd_audit)

    evl = sub.add_parser(
        "eval", help="greedy / mean@n / pass@k accuracy of one or more models on held-out datasets, with breakdowns",
        description="Score models with the recipe's prompt template and reward (the recipe: --config, else the "
        "first model's grpo_zoo run, else the default). One comparison table per dataset; eval.json and eval.md.",
    )
    evl.add_argument("--model", action="append", required=True, metavar="[LABEL=]PATH",
                     help="HF dir, grpo_zoo run/checkpoint dir, or `testbed`; repeat to compare models")
    evl.add_argument("--data", action="append", metavar="[LABEL=]DATA",
                     help="dataset file/dir or `testbed` (its held-out split); repeat for more (default: data.eval)")
    evl.add_argument("--config", help="recipe YAML: template, system prompt, reward, sampling, data columns")
    evl.add_argument("--set", dest="overrides", action="append", default=[], help="key.sub=value recipe override")
    evl.add_argument("--output-dir", help="where eval.json and eval.md go (default: runs/eval-<time>)")
    evl.add_argument("--samples", type=int, default=-1, help="sampled responses per question (eval.samples); 0 = none")
    evl.add_argument("--k", help="comma-separated k for pass@k, each <= --samples (default: --samples)")
    evl.add_argument("--no-greedy", action="store_true", help="skip the greedy response per question")
    evl.add_argument("--by", help="comma-separated dataset columns to break the figures down by, e.g. subject,level")
    evl.add_argument("--limit", type=int, default=0, help="only the first N questions of each dataset")
    evl.add_argument("--batch-size", type=int, default=0, help="sequences per generate call (eval.batch_size)")
    evl.add_argument("--max-new-tokens", type=int, default=0, help="response cut (rollout.max_new_tokens)")
    evl.add_argument("--temperature", type=float, help="sampling temperature (rollout.temperature)")
    evl.add_argument("--top-p", type=float, help="nucleus top-p (rollout.top_p)")
    evl.add_argument("--seed", type=int, default=1234, help="sampling seed, the same for every model (1234)")
    evl.add_argument("--backend", choices=["hf", "vllm", "auto"], help="generation backend (rollout.backend); "
                     "auto = vllm on a GPU where installed")
    evl.add_argument("--chat-template", help="Jinja chat template file or text for models without one; "
                     "`none` = plain text")
    evl.add_argument("--no-progress", action="store_true", help="no progress bar")
    evl.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    evl.set_defaults(func=cmd_eval)

    from grpo_zoo.augment.cli import HELP as AUGMENT_HELP
    from grpo_zoo.augment.cli import add_arguments as add_augment_arguments

    augment = sub.add_parser(
        "augment", help="write DIVA's paraphrase and hint-step columns into a dataset with a teacher model",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=AUGMENT_HELP,
    )
    add_augment_arguments(augment)
    augment.set_defaults(func=cmd_augment)
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
