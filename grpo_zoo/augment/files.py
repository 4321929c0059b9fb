"""Dataset files in and out, unchanged but for the added columns, and the resume journal.

Formats: .jsonl (JSON lines), .json (JSON lines or one array) and .parquet, written back in
the input's own format. Parquet goes through pyarrow untouched (image structs, types and the
Hugging Face feature metadata survive); only the augmentation columns are added or replaced.
The output is written to a temporary sibling and renamed, so it is never half-written.

The journal `<output>.journal` gets one JSON line per finished row as the run goes, so a killed
run resumes where it stopped; its suffix is not a data format, so a dataset directory holding
it still loads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

KINDS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet"}
JOURNAL_SUFFIX = ".journal"


@dataclass
class Table:
    """A dataset file's rows, and what is needed to write it back in the same format."""

    kind: str  # "jsonl" | "json" | "parquet"
    rows: list[dict[str, Any]]  # raw rows (parquet images stay {"bytes", "path"} dicts)
    arrow: Any = None  # parquet: the pyarrow Table, written back with its schema and metadata
    json_array: bool = False  # .json holding one array rather than JSON lines


def file_kind(path: str | Path, what: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in KINDS:
        raise ValueError(f"{what} '{path}' must be a .jsonl, .json or .parquet file (got '{suffix or 'no suffix'}')")
    return KINDS[suffix]


def read_table(path: str | Path) -> Table:
    """Read a .jsonl/.json/.parquet dataset file. Raises ValueError for a missing or unreadable file."""
    path = Path(path).expanduser()
    kind = file_kind(path, "input")
    if not path.is_file():
        raise ValueError(f"input '{path}' does not exist (augment reads one dataset file, not a directory)")
    if kind == "parquet":
        import pyarrow.parquet as pq

        arrow = pq.read_table(path)
        return Table(kind, arrow.to_pylist(), arrow=arrow)
    text = path.read_text(encoding="utf-8")
    if kind == "json" and text.lstrip().startswith("["):
        rows = json.loads(text)
        return Table(kind, _check_rows(rows, path), json_array=True)
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"input '{path}' line {number} is not valid JSON: {exc}") from None
    return Table(kind, _check_rows(rows, path))


def _check_rows(rows: Any, path: Path) -> list[dict[str, Any]]:
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"input '{path}': every row must be a JSON object")
    return rows


def write_table(table: Table, path: str | Path, columns: dict[str, list[Any]]) -> None:
    """Write `table` to `path` (same format) with `columns` added or replaced, atomically.

    Args:
        columns: name -> one value per row (lists of strings, floats).
    """
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".augment-tmp")
    if table.kind == "parquet":
        _write_parquet(table.arrow, tmp, columns)
    else:
        rows = [{**row, **{name: values[i] for name, values in columns.items()}} for i, row in enumerate(table.rows)]
        with open(tmp, "w", encoding="utf-8") as f:
            if table.json_array:
                json.dump(rows, f, ensure_ascii=False)
            else:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def _write_parquet(arrow: Any, tmp: Path, columns: dict[str, list[Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, values in columns.items():
        kind = pa.float64() if values and isinstance(values[0], float) else pa.list_(pa.string())
        array = pa.array(values, type=kind)
        if name in arrow.column_names:
            arrow = arrow.set_column(arrow.column_names.index(name), name, array)
        else:
            arrow = arrow.append_column(name, array)
    metadata = dict(arrow.schema.metadata or {})
    if b"huggingface" in metadata:  # drop stale feature types of our columns; `datasets` infers them
        try:
            info = json.loads(metadata[b"huggingface"])
            features = info.get("info", {}).get("features", {})
            for name in columns:
                features.pop(name, None)
            metadata[b"huggingface"] = json.dumps(info).encode()
        except (ValueError, AttributeError):
            del metadata[b"huggingface"]
    pq.write_table(arrow.replace_schema_metadata(metadata), tmp)


def row_key(problem: Any, answer: Any) -> str:
    """Fingerprint of a row's question, so a journal entry is not applied to a changed input row."""
    return hashlib.sha1(json.dumps([str(problem), str(answer)]).encode()).hexdigest()[:16]


def journal_path(output: str | Path) -> Path:
    output = Path(output).expanduser()
    return output.with_name(output.name + JOURNAL_SUFFIX)


def read_journal(path: Path, keys: list[str]) -> dict[int, dict[str, list[str]]]:
    """Finished parts per row from a journal: row -> {"paraphrases": [...], "hint_steps": [...]}.

    Entries whose row fingerprint no longer matches the input are ignored (the row is redone);
    an unreadable line (a run killed mid-write) is skipped. Later entries win.
    """
    done: dict[int, dict[str, list[str]]] = {}
    if not path.is_file():
        return done
    stale = broken = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
            row = int(entry["row"])
        except (ValueError, KeyError, TypeError):
            broken += 1
            continue
        if not 0 <= row < len(keys) or entry.get("key") != keys[row]:
            stale += 1
            continue
        done.setdefault(row, {}).update({k: v for k, v in entry.get("parts", {}).items() if isinstance(v, list)})
    if stale or broken:
        log.warning("journal %s: ignored %d entries for changed rows and %d unreadable lines", path, stale, broken)
    return done


class Journal:
    """Append-only record of finished rows (flushed and synced after each chunk)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")

    def add(self, row: int, key: str, parts: dict[str, list[str]], rejections: list[str]) -> None:
        entry = {"row": row, "key": key, "parts": parts, "rejections": rejections}
        self._file.write(json.dumps(entry, ensure_ascii=False) + "\n")

    def sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self.sync()
        self._file.close()
