"""Offline augmentation for DIVA-GRPO: paraphrases and hint steps from a teacher model (`grpo-zoo augment`).

    from grpo_zoo.augment import AugmentConfig, TeacherConfig, augment
    report = augment(AugmentConfig(input="train.parquet", output="train_aug.parquet",
                                   teacher=TeacherConfig(source="http://localhost:8000/v1")))

Names are imported lazily, so `grpo-zoo --help` does not pay for torch.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {"AugmentConfig": "config", "TeacherConfig": "config", "AugmentReport": "runner", "augment": "runner"}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'grpo_zoo.augment' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"grpo_zoo.augment.{_EXPORTS[name]}"), name)


__all__ = sorted(_EXPORTS)
