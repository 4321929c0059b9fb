"""`grpo-zoo augment`: write DIVA's paraphrase and hint-step columns into a dataset with a teacher.

For each row still to do, the teacher gets two prompts: rewrite the problem (paraphrases) and
solve it in numbered steps ending in \\boxed{} (hint steps). Replies pass the gates in
grpo_zoo.augment.gates; the teacher's boxed answer is verified against the gold answer in a
worker process (math-verify's time limit needs the main thread or a process, never a thread).
Every input row is written out, in order: rows the teacher failed on (after retries) or whose
material was rejected keep empty lists, and the diva selector falls back to other variant kinds
for them. DIVA's difficulty column is filled with 5 (its starting D_q) where absent.

Resume: finished rows go to `<output>.journal` chunk by chunk; a rerun of the same command
skips them, and rows whose material the input already has, and retries only teacher failures.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from grpo_zoo.augment import files, gates, prompts
from grpo_zoo.augment.config import AugmentConfig
from grpo_zoo.augment.teachers import Teacher, TeacherReply, TeacherRequest, make_teacher
from grpo_zoo.data import BadRow, row_to_question
from grpo_zoo.rewards import last_boxed

log = logging.getLogger(__name__)

PART_COLUMNS = {"paraphrases": "paraphrase_key", "hints": "hint_key"}  # part -> DataConfig field naming its column
_JOURNAL_NAMES = {"paraphrases": "paraphrases", "hints": "hint_steps"}
_MAX_LOGGED_FAILURES = 5


@dataclass
class AugmentReport:
    """What one run did. Counts are rows unless named otherwise."""

    output: str
    rows: int  # input rows = output rows
    attempted: int = 0  # rows sent to the teacher in this run
    augmented: int = 0  # rows that got new paraphrases or hint steps in this run
    skipped: int = 0  # rows with nothing to do: material in the input or the journal already
    failed: int = 0  # rows with a teacher failure after retries: left un-augmented, retried by a rerun
    rejected_rows: int = 0  # rows where the gates rejected a requested part entirely
    rejections: dict[str, int] = field(default_factory=dict)  # reason -> count (paraphrases: per candidate)
    with_paraphrases: int = 0  # output rows with >= 1 paraphrase
    with_hints: int = 0  # output rows with >= 1 hint step
    seconds: float = 0.0

    def summary(self) -> str:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(self.rejections.items())) or "none"
        return (f"augment: wrote {self.rows} rows to {self.output} in {self.seconds:.1f}s; "
                f"{self.attempted} sent to the teacher, {self.augmented} augmented, {self.skipped} already done, "
                f"{self.failed} failed (rerun to retry), {self.rejected_rows} with a part rejected; "
                f"output rows with paraphrases {self.with_paraphrases}, with hint steps {self.with_hints}; "
                f"rejections: {reasons}")


@dataclass
class _Job:
    """One row in flight: what to ask for, and what came back."""

    row: int
    key: str
    parts: list[str]  # "paraphrases" and/or "hints"
    problem: str = ""  # raw problem text, as stored
    answer: str = ""
    images: list[Any] = field(default_factory=list)
    done: dict[str, list[str]] = field(default_factory=dict)  # part -> kept material (maybe [])
    rejections: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def augment(cfg: AugmentConfig, teacher: Teacher | None = None) -> AugmentReport:
    """Augment cfg.input into cfg.output (see the module docstring).

    `teacher` None = make one from cfg.teacher (and close it at the end); a given one is left open.

    Raises ValueError for a bad file, missing columns, bad templates or an unusable teacher;
    teacher failures on single rows are counted, never raised.
    """
    started = time.monotonic()
    if files.file_kind(cfg.output, "output") != files.file_kind(cfg.input, "input"):
        raise ValueError(f"output '{cfg.output}' must have the input's format ({cfg.input}); change its suffix")
    table = files.read_table(cfg.input)
    d = cfg.data
    if table.rows and (missing := [k for k in (d.problem_key, d.answer_key) if k not in table.rows[0]]):
        raise ValueError(f"input '{cfg.input}' has no column {missing[0]!r} (columns: {sorted(table.rows[0])}); "
                         "pass --problem-key / --answer-key")
    templates = {"paraphrases": prompts.load_template(cfg.paraphrase_template, "paraphrase.txt"),
                 "hints": prompts.load_template(cfg.solve_template, "solve.txt")}
    keys = [files.row_key(r.get(d.problem_key), r.get(d.answer_key)) for r in table.rows]
    journal_file = files.journal_path(cfg.output)
    done = files.read_journal(journal_file, keys)
    report = AugmentReport(output=cfg.output, rows=len(table.rows))
    jobs = _plan(cfg, table.rows, keys, done, report)
    own_teacher = bool(jobs) and teacher is None
    if own_teacher:
        teacher = make_teacher(cfg.teacher)
    try:
        if jobs:
            _run(cfg, teacher, templates, table.rows, jobs, done, report, journal_file)
    finally:  # also on Ctrl-C: every row is written, with what was finished (the journal keeps it too)
        if own_teacher:
            teacher.close()
        _write(cfg, table, done, report)
    report.seconds = time.monotonic() - started
    return report


def _plan(cfg: AugmentConfig, rows: list[dict[str, Any]], keys: list[str], done: dict[int, dict[str, list[str]]],
          report: AugmentReport) -> list[_Job]:
    jobs = []
    for i, row in enumerate(rows):
        has = done.get(i, {})
        parts = [p for p in cfg.parts
                 if _JOURNAL_NAMES[p] not in has and not _strings(row.get(getattr(cfg.data, PART_COLUMNS[p])))]
        if not parts:
            report.skipped += 1
        elif not cfg.limit or len(jobs) < cfg.limit:
            jobs.append(_Job(i, keys[i], parts))
    return jobs


def _run(cfg: AugmentConfig, teacher: Teacher, templates: dict[str, str], rows: list[dict[str, Any]],
         jobs: list[_Job], done: dict[int, dict[str, list[str]]], report: AugmentReport, journal_file: Any) -> None:
    from tqdm import tqdm

    from grpo_zoo.reward_runner import RewardRunner

    chunk = cfg.chunk_rows or max(4 * teacher.batch_size, 1)
    verifier = RewardRunner([(cfg.verifier, 1.0)], accuracy_function=cfg.verifier,
                            timeout_s=cfg.verify_timeout_s, num_workers=cfg.verify_workers)
    journal = files.Journal(journal_file)
    rejections: Counter[str] = Counter()
    bar = tqdm(total=len(jobs), unit="row", desc="augment", disable=not cfg.progress, dynamic_ncols=True)
    try:
        for start in range(0, len(jobs), chunk):
            batch = jobs[start : start + chunk]
            _ask(cfg, teacher, templates, rows, batch, verifier)
            for job in batch:
                _record(job, journal, done, report, rejections)
            journal.sync()
            bar.update(len(batch))
            bar.set_postfix(augmented=report.augmented, failed=report.failed, rejected=report.rejected_rows)
    finally:
        bar.close()
        journal.close()
        verifier.close()
        report.rejections = dict(rejections)


def _ask(cfg: AugmentConfig, teacher: Teacher, templates: dict[str, str], rows: list[dict[str, Any]],
         batch: list[_Job], verifier: Any) -> None:
    """Prompt the teacher for every job of the batch, then gate and verify the replies (main thread)."""
    requests: list[TeacherRequest] = []
    owners: list[tuple[_Job, str]] = []
    for job in batch:
        if not _load(cfg, rows[job.row], job):
            continue
        has_images = bool(job.images) or prompts.IMAGE_TAG in job.problem
        text = prompts.to_teacher_text(job.problem, cfg.image_marker)
        for part in job.parts:
            filled = prompts.render(templates[part], has_images=has_images, problem=text, answer=job.answer,
                                    num_paraphrases=cfg.num_paraphrases, image_marker=cfg.image_marker)
            requests.append(TeacherRequest(filled, job.images if teacher.supports_images else []))
            owners.append((job, part))
    replies = teacher.complete(requests) if requests else []
    if len(replies) != len(requests):
        raise RuntimeError(f"teacher returned {len(replies)} replies for {len(requests)} requests")
    solutions: list[tuple[_Job, TeacherReply]] = []
    for (job, part), reply in zip(owners, replies):
        if reply.text is None:
            job.failures.append(f"{part}: {reply.error}")
        elif part == "paraphrases":
            found = prompts.parse_paraphrases(reply.text)
            found = None if found is None else [prompts.from_teacher_text(p, cfg.image_marker) for p in found]
            kept, reasons = gates.gate_paraphrases(found, job.problem, job.answer, cfg.num_paraphrases)
            _settle(job, "paraphrases", kept, reasons)
        else:
            solutions.append((job, reply))
    _verify_solutions(cfg, solutions, verifier)


def _verify_solutions(cfg: AugmentConfig, solutions: list[tuple[Any, TeacherReply]], verifier: Any) -> None:
    finals = [prompts.final_part(reply.text or "") for _, reply in solutions]
    boxed = [i for i, text in enumerate(finals) if last_boxed(text) is not None]
    correct = set()
    if boxed:
        result = verifier.score([finals[i] for i in boxed], [solutions[i][0].answer for i in boxed])
        correct = {i for i, value in zip(boxed, result.accuracy.tolist()) if value > 0.5}
    for i, (job, reply) in enumerate(solutions):
        steps = prompts.parse_steps(reply.text or "")
        steps = None if steps is None else [prompts.step_text(s, cfg.image_marker) for s in steps]
        kept, reasons = gates.gate_hints(steps, last_boxed(finals[i]), i in correct, job.answer, cfg.min_hint_steps)
        _settle(job, "hints", kept, reasons)


def _load(cfg: AugmentConfig, row: dict[str, Any], job: _Job) -> bool:
    """Fill the job's problem, answer and images from its row; an unreadable row is settled empty."""
    try:
        question = row_to_question(row, job.row, cfg.data)
    except BadRow as exc:
        for part in job.parts:
            _settle(job, part, [], [])
        job.rejections.append("unreadable_row")
        log.warning("row %d: cannot be read (%s); left un-augmented", job.row, exc)
        return False
    job.problem, job.answer, job.images = str(row[cfg.data.problem_key]), question.answer, question.images
    return True


def _settle(job: _Job, part: str, kept: list[str], reasons: list[str]) -> None:
    job.done[part] = kept
    job.rejections.extend(reasons)


def _record(job: _Job, journal: files.Journal, done: dict[int, dict[str, list[str]]], report: AugmentReport,
            rejections: Counter[str]) -> None:
    report.attempted += 1
    parts = {_JOURNAL_NAMES[p]: v for p, v in job.done.items()}
    if parts:  # a part the teacher failed on is not journaled, so a rerun asks again
        journal.add(job.row, job.key, parts, job.rejections)
        done.setdefault(job.row, {}).update(parts)
    rejections.update(job.rejections)
    if any(parts.values()):
        report.augmented += 1
    if any(not v for v in job.done.values()):
        report.rejected_rows += 1
    if job.rejections:
        log.info("row %d: rejected %s", job.row, ", ".join(job.rejections))
    if job.failures:
        report.failed += 1
        if report.failed <= _MAX_LOGGED_FAILURES:
            log.warning("row %d: teacher failed, left un-augmented: %s", job.row, "; ".join(job.failures))
        elif report.failed == _MAX_LOGGED_FAILURES + 1:
            log.warning("more teacher failures; only their count is reported from now on")


def _write(cfg: AugmentConfig, table: files.Table, done: dict[int, dict[str, list[str]]],
           report: AugmentReport) -> None:
    """Every input row, in order, with the paraphrase, hint and difficulty columns."""
    d = cfg.data
    paraphrases, hints, difficulty = [], [], []
    for i, row in enumerate(table.rows):
        entry = done.get(i, {})
        paraphrases.append(_strings(row.get(d.paraphrase_key)) or entry.get("paraphrases", []))
        hints.append(_strings(row.get(d.hint_key)) or entry.get("hint_steps", []))
        difficulty.append(_difficulty(row.get(cfg.difficulty_key), cfg.initial_difficulty))
    report.with_paraphrases = sum(bool(p) for p in paraphrases)
    report.with_hints = sum(bool(h) for h in hints)
    files.write_table(table, cfg.output,
                      {d.paraphrase_key: paraphrases, d.hint_key: hints, cfg.difficulty_key: difficulty})


def _strings(value: Any) -> list[str]:
    """A column value as a list of non-empty strings (a bare string counts as one item)."""
    items = value if isinstance(value, (list, tuple)) else ([] if value is None else [value])
    return [s for s in items if isinstance(s, str) and s.strip()]


def _difficulty(value: Any, default: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return float(default)
    return number if math.isfinite(number) else float(default)


__all__ = ["AugmentReport", "augment"]
