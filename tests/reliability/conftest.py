"""Shared helpers of the reliability tests (issue #7): a tiny random VLM, tiny run overrides, images.

Test modules get the helper functions through the `h` fixture (with --import-mode=importlib a
conftest is not importable by name).
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest


@pytest.fixture(autouse=True)
def torch_globals():
    """One intra-op thread: on a shared 2-core machine two threads spin against each other (8x slower).

    Afterwards, flush-denormal (which trainer.train switches on for the process) is switched
    off again: left on, it breaks hypothesis' float strategies in every later test.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
    torch.set_flush_denormal(False)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A random Qwen2.5-VL-architecture model (~2M parameters, built in well under a second)."""
    from grpo_zoo.testbed.tiny_model import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def tiny_overrides(model_dir: Path, out_dir: Path, *extra: str) -> list[str]:
    """A run of 2 steps x 2 questions x G = 4 short responses on the testbed task, no eval, no workers."""
    return [
        f"model.path={model_dir}",
        "testbed.train_questions=16",
        "testbed.eval_questions=4",
        "rollout.group_size=4",
        "rollout.max_new_tokens=4",
        "train.steps=2",
        "train.questions_per_step=2",
        "train.lr=1e-2",
        "eval.num_questions=0",
        "eval.at_start=false",
        "eval.every=0",
        "output.tensorboard=false",
        "output.progress=false",
        "reward.num_workers=0",
        f"output.dir={out_dir}",
        *extra,
    ]


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def comparable(run_dir: Path) -> list[dict]:
    """metrics.jsonl without wall-clock fields: what must be bit-identical across a resume."""
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records(run_dir)]


def png_bytes(width: int = 8, height: int = 8, color: str = "red") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, "PNG")
    return buf.getvalue()


def bomb_png(width: int, height: int) -> bytes:
    """A ~60-byte PNG whose header claims width x height pixels: a decompression bomb if decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="session")
def h() -> SimpleNamespace:
    """The helpers above, for test modules."""
    return SimpleNamespace(
        tiny_overrides=tiny_overrides,
        records=records,
        comparable=comparable,
        png_bytes=png_bytes,
        bomb_png=bomb_png,
        write_jsonl=write_jsonl,
    )
