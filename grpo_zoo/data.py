"""Question pools from local datasets (EasyR1/verl layout) or the built-in testbed.

A row becomes a Question; a row that cannot be read (missing or corrupt image, an image far
beyond any sane size, an empty answer) is skipped with one warning naming the dataset and
the row, and counted. More bad rows than `max_bad_row_share` stops the run with a message;
`strict` stops at the first.
"""

from __future__ import annotations

import io
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from grpo_zoo.config import DataConfig, TestbedConfig
from grpo_zoo.configuration import ConfigError
from grpo_zoo.types import Question

log = logging.getLogger(__name__)

TESTBED = "testbed"
MAX_IMAGE_PIXELS = 8192 * 8192  # anything larger is a decompression bomb, not a training image
_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}


class BadRow(ValueError):
    """A dataset row that cannot become a Question."""


@dataclass
class LoadReport:
    source: str
    rows: int
    skipped: int
    reasons: dict[str, int]


def load_questions(
    source: str, data: DataConfig, testbed: TestbedConfig, split: str
) -> tuple[list[Question], LoadReport]:
    """Load the `split` ("train" or "eval") pool from a file, a directory, or `testbed`."""
    if source == TESTBED:
        from grpo_zoo.testbed.task import make_questions

        n = testbed.train_questions if split == "train" else testbed.eval_questions
        questions = make_questions(split, n, testbed.seed)
        return questions, LoadReport(source, len(questions), 0, {})
    rows = _read_rows(source, split)
    return rows_to_questions(rows, data, source)


def _read_rows(source: str, split: str) -> list[dict[str, Any]]:
    path = Path(source).expanduser()
    if not path.exists():
        raise ConfigError(
            f"dataset '{source}' does not exist: give a local parquet/jsonl/arrow file or directory, or 'testbed'"
        )
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in _FORMATS)
    if not files:
        raise ConfigError(f"dataset directory '{source}' holds no .parquet, .jsonl, .json or .arrow file")
    kinds = {_FORMATS.get(p.suffix) for p in files}
    if None in kinds or len(kinds) != 1:
        raise ConfigError(f"dataset '{source}': cannot mix or read these files: {[p.name for p in files][:5]}")
    import datasets

    datasets.disable_progress_bars()
    kind = kinds.pop()
    dataset = datasets.load_dataset(kind, data_files=[str(p) for p in files], split="train")
    return list(dataset)


def rows_to_questions(rows: list[dict[str, Any]], data: DataConfig, source: str) -> tuple[list[Question], LoadReport]:
    if rows:
        missing = [k for k in (data.problem_key, data.answer_key) if k not in rows[0]]
        if missing:
            raise ConfigError(
                f"dataset '{source}' has no column {missing[0]!r} (columns: {sorted(rows[0])}); "
                f"set data.{'problem_key' if missing[0] == data.problem_key else 'answer_key'} to the right column"
            )
    questions: list[Question] = []
    reasons: dict[str, int] = {}
    for index, row in enumerate(rows):
        try:
            questions.append(row_to_question(row, len(questions), data))
        except BadRow as exc:
            if data.strict:
                raise ConfigError(f"dataset '{source}' row {index}: {exc} (data.strict is on)") from None
            reason = str(exc).split(":")[0]
            reasons[reason] = reasons.get(reason, 0) + 1
            log.warning("skipping dataset '%s' row %d: %s", source, index, exc)
    skipped = sum(reasons.values())
    if rows and skipped / len(rows) > data.max_bad_row_share:
        raise ConfigError(
            f"dataset '{source}': {skipped} of {len(rows)} rows are unreadable ({reasons}), more than "
            f"data.max_bad_row_share = {data.max_bad_row_share}; fix the data or raise that share"
        )
    if not questions:
        raise ConfigError(f"dataset '{source}' has no usable rows")
    return questions, LoadReport(source, len(rows), skipped, reasons)


def row_to_question(row: dict[str, Any], question_id: int, data: DataConfig) -> Question:
    problem = row.get(data.problem_key)
    answer = row.get(data.answer_key)
    if not isinstance(problem, str) or not problem.strip():
        raise BadRow(f"empty problem: column {data.problem_key!r} is {problem!r}")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        raise BadRow(f"empty answer: column {data.answer_key!r} is {answer!r}")
    images = [_to_image(item) for item in _as_list(row.get(data.image_key))]
    if problem.count("<image>") not in (0, len(images)):
        raise BadRow(f"image count mismatch: {problem.count('<image>')} <image> tags but {len(images)} images")
    if images and "<image>" not in problem:
        problem = "<image>" * len(images) + problem
    known = {data.problem_key, data.answer_key, data.image_key, data.paraphrase_key, data.hint_key}
    return Question(
        question_id=question_id,
        problem=problem,
        answer=answer.strip(),
        images=images,
        paraphrases=[p for p in _as_list(row.get(data.paraphrase_key)) if isinstance(p, str) and p.strip()],
        hint_steps=[s for s in _as_list(row.get(data.hint_key)) if isinstance(s, str) and s.strip()],
        extras={k: v for k, v in row.items() if k not in known},
    )


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _to_image(item: Any) -> Image.Image:
    if isinstance(item, Image.Image):
        image = item
    else:
        if isinstance(item, dict):
            item = item.get("bytes") or item.get("path")
        if isinstance(item, (bytes, bytearray)):
            source: Any = io.BytesIO(item)
        elif isinstance(item, str):
            source = Path(item).expanduser()
            if not source.is_file():
                raise BadRow(f"missing image: file {item!r} does not exist")
        else:
            raise BadRow(f"unreadable image: unsupported value of type {type(item).__name__}")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                image = Image.open(source)
                if image.width * image.height > MAX_IMAGE_PIXELS:
                    raise BadRow(f"oversized image: {image.width}x{image.height} pixels")
                image.load()
        except BadRow:
            raise
        except (OSError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise BadRow(f"corrupt image: {exc}") from None
    if image.width * image.height > MAX_IMAGE_PIXELS:
        raise BadRow(f"oversized image: {image.width}x{image.height} pixels")
    return image.convert("RGB")
