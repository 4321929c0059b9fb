"""Flags of `grpo-zoo augment` and the command itself (grpo_zoo.cli registers the subcommand)."""

from __future__ import annotations

import argparse
import logging
import sys

from grpo_zoo.augment.config import PARTS, AugmentConfig, TeacherConfig
from grpo_zoo.config import DataConfig

HELP = """\
Write the columns DIVA-GRPO's diva selector reads into a dataset (EasyR1/verl layout: a problem
with <image> tags, an answer, images): paraphrases (list of strings), hint steps (list of
strings) and difficulty (5 where absent). A teacher model paraphrases each problem and solves
it in numbered steps; steps are kept only when its final \\boxed{} answer verifies against the
ground truth (math-verify) and never include the answer itself; a paraphrase must keep the
original's <image> tags. Every input row is written out; rows the teacher fails on or whose
material is rejected stay un-augmented (the selector falls back to other variant kinds).

Teachers: a local Hugging Face model directory (text or vision-language, run with transformers,
batched), or the URL of any OpenAI-compatible server, e.g. `vllm serve Qwen/Qwen2.5-VL-7B-Instruct`
then --teacher http://localhost:8000/v1 (requests run in parallel, retried with backoff).
Prompts: the packaged templates (grpo_zoo/augment/templates/*.txt) or your own files.

Resumable: progress is journaled in OUTPUT.journal; rerun the same command to continue or to
retry rows that failed. Rows that already have material in the input are skipped.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The augment flags, on `parser`."""
    data, teacher = DataConfig(), TeacherConfig()
    parser.add_argument("--input", required=True, help="dataset file: .jsonl, .json or .parquet")
    parser.add_argument("--output", required=True, help="output file, same format (may equal --input)")
    parser.add_argument("--teacher", required=True, help="local model directory, or http(s) URL of a chat endpoint")
    parser.add_argument("--teacher-model", default="", help="endpoint model name (default: the first it serves)")
    parser.add_argument("--api-key-env", default=teacher.api_key_env, help="env var with the endpoint's API key")
    parser.add_argument("--text-only", action="store_true", help="endpoint: do not send images")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"what to write, comma-separated ({','.join(PARTS)})")
    parser.add_argument("--paraphrases", type=int, default=3, help="paraphrases asked per row (default 3)")
    parser.add_argument("--paraphrase-template", default="", help="template file for the paraphrase prompt")
    parser.add_argument("--solve-template", default="", help="template file for the step-by-step solution prompt")
    parser.add_argument("--system-prompt", default="", help="system message for the teacher")
    parser.add_argument("--temperature", type=float, default=teacher.temperature, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=teacher.top_p)
    parser.add_argument("--max-new-tokens", type=int, default=teacher.max_new_tokens)
    parser.add_argument("--workers", type=int, default=teacher.workers, help="endpoint: requests in flight")
    parser.add_argument("--batch-size", type=int, default=teacher.batch_size, help="local: prompts per generate")
    parser.add_argument("--device", default=teacher.device, help="local: cpu, cuda, auto")
    parser.add_argument("--dtype", default=teacher.dtype, help="local: float32, bfloat16, float16")
    parser.add_argument("--threads", type=int, help="local: torch CPU threads (default: torch's)")
    parser.add_argument("--timeout", type=float, default=teacher.timeout_s, help="endpoint: seconds per request")
    parser.add_argument("--retries", type=int, default=teacher.max_retries, help="endpoint: retries per request")
    parser.add_argument("--backoff", type=float, default=teacher.backoff_s, help="endpoint: first retry wait (s)")
    parser.add_argument("--verify-workers", type=int, default=1, help="answer-checking processes (0 = inline)")
    parser.add_argument("--limit", type=int, default=0, help="augment at most N rows this run (all are written)")
    for key in ("problem_key", "answer_key", "image_key", "paraphrase_key", "hint_key"):
        parser.add_argument("--" + key.replace("_", "-"), default=getattr(data, key), help="column name")
    parser.add_argument("--difficulty-key", default="difficulty", help="column name")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("-q", "--quiet", action="store_true", help="log only warnings, not each rejected row")


def config_from_args(args: argparse.Namespace) -> AugmentConfig:
    """The AugmentConfig for parsed flags; raises ValueError on bad values."""
    teacher = TeacherConfig(
        source=args.teacher, model=args.teacher_model, api_key_env=args.api_key_env, vision=not args.text_only,
        temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
        system_prompt=args.system_prompt, device=args.device, dtype=args.dtype, batch_size=args.batch_size,
        workers=args.workers, timeout_s=args.timeout, max_retries=args.retries, backoff_s=args.backoff,
    )
    data = DataConfig(problem_key=args.problem_key, answer_key=args.answer_key, image_key=args.image_key,
                      paraphrase_key=args.paraphrase_key, hint_key=args.hint_key)
    return AugmentConfig(
        input=args.input, output=args.output, data=data, difficulty_key=args.difficulty_key,
        parts=tuple(p.strip() for p in args.parts.split(",") if p.strip()), num_paraphrases=args.paraphrases,
        paraphrase_template=args.paraphrase_template, solve_template=args.solve_template,
        verify_workers=args.verify_workers, limit=args.limit, progress=not args.no_progress, teacher=teacher,
    )


def run_cli(args: argparse.Namespace) -> int:
    """Run `grpo-zoo augment`; 0 on success, 2 on bad input (message on stderr)."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    from grpo_zoo.augment.runner import augment

    logger = logging.getLogger("grpo_zoo.augment")
    logger.setLevel(logging.WARNING if args.quiet else logging.INFO)
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        logger.addHandler(handler)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        cfg = config_from_args(args)
        with logging_redirect_tqdm(loggers=[logger]):  # log lines go above the progress bar
            report = augment(cfg)
    except ValueError as exc:
        print(f"grpo-zoo augment: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("grpo-zoo augment: interrupted; finished rows are journaled, rerun the same command to continue",
              file=sys.stderr)
        return 130
    print(report.summary())
    return 0
