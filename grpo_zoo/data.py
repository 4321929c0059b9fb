"""Question pools from local datasets (EasyR1/verl layout) or the built-in testbed.

A row becomes a Question; a row that cannot be read (missing or corrupt image, an image far
beyond any sane size, an empty or non-string answer) is skipped with one warning naming the
dataset and the row, and counted. Once the policy is loaded, `drop_long_prompts` skips the
rows whose prompt exceeds data.max_prompt_length tokens the same way. More bad rows than
`max_bad_row_share` stops the run with a message; `strict` stops at the first. Bad rows are
dropped before any batch is drawn, so one never reaches (or poisons) a training batch.
Images are decoded here, by Pillow under a pixel limit, never by `datasets` (whose decoder
would raise on the first corrupt image and abort the whole load).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
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
    """What loading one pool did: rows read, rows skipped, and why (reason -> count)."""

    source: str
    rows: int
    skipped: int
    reasons: dict[str, int] = field(default_factory=dict)
    kept_rows: list[int] = field(default_factory=list)  # the dataset row of each question id (empty = same)

    def metrics(self, split: str) -> dict[str, float]:
        """`data/<split>_rows`, `data/<split>_skipped` and one `data/<split>_skipped_<reason>` per reason."""
        out = {f"data/{split}_rows": float(self.rows), f"data/{split}_skipped": float(self.skipped)}
        for reason, count in sorted(self.reasons.items()):
            out[f"data/{split}_skipped_{reason.replace(' ', '_')}"] = float(count)
        return out


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
    return rows_to_questions(rows, data, source, root=_dataset_root(source))


def _dataset_root(source: str) -> Path:
    path = Path(source).expanduser()
    return path if path.is_dir() else path.parent


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
    if all(p.suffix == ".jsonl" for p in files):
        return [row for p in files for row in _read_jsonl(p)]
    import datasets

    datasets.disable_progress_bars()
    kind = kinds.pop()
    try:
        dataset = datasets.load_dataset(kind, data_files=[str(p) for p in files], split="train")
    except Exception as exc:  # unparsable file: the library's own message, with the file named
        raise ConfigError(f"dataset '{source}' cannot be read as {kind}: {type(exc).__name__}: {exc}") from None
    undecoded = _without_image_decoding(dataset.features)
    if undecoded != dataset.features:
        dataset = dataset.cast(undecoded)  # images stay {"bytes", "path"} until _to_image checks them
    return list(dataset)


class CorruptRow(str):
    """Stands in for a row that could not even be parsed (a broken JSON line); skipped as a bad row."""


def _read_jsonl(path: Path) -> list[dict[str, Any] | CorruptRow]:
    """One row per non-empty line, read here rather than by `datasets`: its loader aborts the whole
    file at the first broken line and forces one type per column across rows."""
    rows: list[dict[str, Any] | CorruptRow] = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                rows.append(CorruptRow(f"{path.name} line {number} is not JSON ({exc})"))
                continue
            rows.append(row if isinstance(row, dict) else CorruptRow(f"{path.name} line {number} is not an object"))
    return rows


def _without_image_decoding(feature: Any) -> Any:
    """The same feature tree with every datasets.Image set to decode=False."""
    import datasets

    if isinstance(feature, datasets.Image):
        return datasets.Image(decode=False)
    if isinstance(feature, datasets.Features):
        return datasets.Features({k: _without_image_decoding(v) for k, v in feature.items()})
    if isinstance(feature, dict):
        return {k: _without_image_decoding(v) for k, v in feature.items()}
    if isinstance(feature, list):
        return [_without_image_decoding(v) for v in feature]
    if dataclasses.is_dataclass(feature) and hasattr(feature, "feature"):  # List / Sequence / LargeList
        return dataclasses.replace(feature, feature=_without_image_decoding(feature.feature))
    return feature


class _Skips:
    """Counts bad rows of one dataset; enforces data.strict and data.max_bad_row_share."""

    def __init__(self, source: str, data: DataConfig, reasons: dict[str, int] | None = None):
        self.source = source
        self.data = data
        self.reasons = dict(reasons or {})

    def skip(self, index: int, exc: BadRow) -> None:
        if self.data.strict:
            raise ConfigError(
                f"dataset '{self.source}' row {index}: {exc} (data.strict / --strict stops at the first bad row; "
                "fix the row or drop --strict to skip it)"
            )
        reason = str(exc).split(":")[0]
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        log.warning("skipping dataset '%s' row %d: %s", self.source, index, exc)

    def report(self, rows: int, kept_rows: list[int]) -> LoadReport:
        skipped = sum(self.reasons.values())
        if rows and skipped / rows > self.data.max_bad_row_share:
            raise ConfigError(
                f"dataset '{self.source}': {skipped} of {rows} rows are bad ({self.reasons}), more than "
                f"data.max_bad_row_share = {self.data.max_bad_row_share}; fix the data or raise that share"
            )
        if not kept_rows:
            raise ConfigError(f"dataset '{self.source}' has no usable rows")
        return LoadReport(self.source, rows, skipped, self.reasons, kept_rows)


def rows_to_questions(
    rows: list[Any], data: DataConfig, source: str, root: Path | None = None
) -> tuple[list[Question], LoadReport]:
    """Questions from raw rows (question ids 0..n-1 in row order, bad rows skipped), and the report.

    A row is a dict of columns; anything else (a CorruptRow of a broken JSON line) is a bad row.

    `root` is where relative image paths are looked up when they do not exist from the
    working directory (the dataset's directory). Raises ConfigError for a missing column,
    the first bad row under data.strict, or more bad rows than data.max_bad_row_share.
    """
    _check_columns(rows, data, source)
    questions: list[Question] = []
    kept_rows: list[int] = []
    skips = _Skips(source, data)
    for index, row in enumerate(rows):
        try:
            questions.append(row_to_question(row, len(questions), data, root))
            kept_rows.append(index)
        except BadRow as exc:
            skips.skip(index, exc)
    return questions, skips.report(len(rows), kept_rows)


def _check_columns(rows: list[Any], data: DataConfig, source: str) -> None:
    present = {k for row in rows if isinstance(row, dict) for k in row}
    if not present:
        return
    columns = sorted(str(k) for k in present)
    for key in ("problem_key", "answer_key"):
        name = getattr(data, key)
        if name not in present:
            raise ConfigError(
                f"dataset '{source}' has no column {name!r} (columns: {columns}); set data.{key} to the right column"
            )
    if data.image_key not in present:
        tagged = next((r for r in rows if isinstance(r, dict) and "<image>" in str(r.get(data.problem_key))), None)
        if tagged is not None:
            raise ConfigError(
                f"dataset '{source}' problems contain <image> tags but there is no column {data.image_key!r} "
                f"(columns: {columns}); set data.image_key to the image column"
            )


def drop_long_prompts(
    questions: list[Question],
    prompt_length: Callable[[Question], int],
    data: DataConfig,
    report: LoadReport,
) -> tuple[list[Question], LoadReport]:
    """Skip the questions whose prompt is longer than data.max_prompt_length tokens (counted, warned).

    prompt_length(q): the prompt's token count as the policy encodes it (chat template and
    image tokens included); it may raise BadRow for a prompt the policy cannot encode.
    The survivors are renumbered 0..n-1 (question ids index the pool).
    The shares and strictness of `report`'s dataset apply to the load and length skips together.
    Raises ConfigError like rows_to_questions.
    """
    limit = data.max_prompt_length
    skips = _Skips(report.source, data, report.reasons)
    kept: list[Question] = []
    kept_rows: list[int] = []
    for question in questions:
        row = report.kept_rows[question.question_id] if report.kept_rows else question.question_id
        try:
            tokens = prompt_length(question)
            if tokens > limit:
                raise BadRow(f"prompt too long: {tokens} tokens > data.max_prompt_length = {limit}")
        except BadRow as exc:
            skips.skip(row, exc)
            continue
        kept.append(dataclasses.replace(question, question_id=len(kept)))
        kept_rows.append(row)
    if len(kept) == len(questions):
        return questions, report
    return kept, skips.report(report.rows, kept_rows)


def fit_to_policy(
    questions: list[Question], report: LoadReport, policy: Any, data: DataConfig
) -> tuple[list[Question], LoadReport]:
    """drop_long_prompts with the policy's own encoding (template, chat template, image tokens).

    The testbed's generated prompts (~70 tokens) are not measured: encoding thousands of
    images would only slow every start-up.
    """
    if report.source == TESTBED:
        return questions, report
    from grpo_zoo.types import Prompt

    def prompt_length(q: Question) -> int:
        try:
            encoded = policy.encode(
                [Prompt(q.question_id, q.problem, q.answer, q.images)],
                template=data.prompt_template,
                system_prompt=data.system_prompt,
            )
        except ValueError as exc:  # e.g. images for a text-only model: this row cannot be a prompt
            raise BadRow(f"unusable prompt: {exc}") from None
        return int(encoded.lengths[0])

    return drop_long_prompts(questions, prompt_length, data, report)


def row_to_question(row: Any, question_id: int, data: DataConfig, root: Path | None = None) -> Question:
    """One dataset row as a Question; raises BadRow (reason: detail) when it cannot be one."""
    if not isinstance(row, dict):
        raise BadRow(f"corrupt row: {row}")
    problem = row.get(data.problem_key)
    if not isinstance(problem, str) or not problem.strip():
        raise BadRow(f"empty problem: column {data.problem_key!r} is {_short(problem)}")
    answer = _answer_text(row.get(data.answer_key), data.answer_key)
    images = [_to_image(item, root) for item in _as_list(row.get(data.image_key))]
    if problem.count("<image>") not in (0, len(images)):
        raise BadRow(f"image count mismatch: {problem.count('<image>')} <image> tags but {len(images)} images")
    if images and "<image>" not in problem:
        problem = "<image>" * len(images) + problem
    known = {data.problem_key, data.answer_key, data.image_key, data.paraphrase_key, data.hint_key}
    return Question(
        question_id=question_id,
        problem=problem,
        answer=answer,
        images=images,
        paraphrases=[p for p in _as_list(row.get(data.paraphrase_key)) if isinstance(p, str) and p.strip()],
        hint_steps=[s for s in _as_list(row.get(data.hint_key)) if isinstance(s, str) and s.strip()],
        extras={k: v for k, v in row.items() if k not in known},
    )


def _answer_text(answer: Any, key: str) -> str:
    """The gold answer as a non-empty string; numbers are accepted (an int column read as float too)."""
    if answer is None:
        raise BadRow(f"empty answer: column {key!r} is None")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        if not math.isfinite(answer):
            raise BadRow(f"bad answer: column {key!r} is {answer!r}, not a finite number")
        if isinstance(answer, float) and answer.is_integer() and abs(answer) < 2**53:
            answer = int(answer)  # an int column with a null somewhere is read as float: 3.0 means 3
        answer = str(answer)
    if not isinstance(answer, str):
        raise BadRow(f"bad answer: column {key!r} is a {type(answer).__name__} ({_short(answer)}), not a string")
    if not answer.strip():
        raise BadRow(f"empty answer: column {key!r} is {answer!r}")
    return answer.strip()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _to_image(item: Any, root: Path | None = None) -> Image.Image:
    """A decoded RGB image from a PIL image, bytes, a path, or a datasets {"bytes", "path"} dict.

    Raises BadRow for a missing file, undecodable bytes, or more than MAX_IMAGE_PIXELS pixels
    (checked from the header, before any pixel is decoded: a decompression bomb costs nothing).
    """
    if isinstance(item, Image.Image):
        image = item
    else:
        image = _open_image(_image_source(item, root))
    if image.width * image.height > MAX_IMAGE_PIXELS:
        raise BadRow(f"oversized image: {image.width}x{image.height} pixels > {MAX_IMAGE_PIXELS}")
    return image.convert("RGB")


def _image_source(item: Any, root: Path | None) -> Any:
    if isinstance(item, dict):
        item = item.get("bytes") or item.get("path")
    if isinstance(item, (bytes, bytearray)):
        return io.BytesIO(item)
    if isinstance(item, str) and item:
        path = Path(item).expanduser()
        if not path.is_file() and root is not None and not path.is_absolute() and (root / path).is_file():
            path = root / path
        if not path.is_file():
            raise BadRow(f"missing image: file {item!r} does not exist")
        return path
    raise BadRow(f"unreadable image: unsupported value of type {type(item).__name__}")


def _open_image(source: Any) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as opened:
                if opened.width * opened.height > MAX_IMAGE_PIXELS:
                    raise BadRow(f"oversized image: {opened.width}x{opened.height} pixels > {MAX_IMAGE_PIXELS}")
                opened.load()
                return opened.copy()
    except BadRow:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise BadRow(f"oversized image: {exc}") from None
    except Exception as exc:  # PIL plugins report crafted data as OSError, SyntaxError, struct.error, ...
        raise BadRow(f"corrupt image: {type(exc).__name__}: {exc}") from None
