"""Save nested state (tensors, numpy arrays, plain data) as safetensors + JSON.

Checkpoints never unpickle: every tensor or array goes into one safetensors file under a
path-like key, and everything else into a JSON file that points at those keys.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

_TENSOR = "__tensor__"
_ARRAY = "__ndarray__"
_TUPLE = "__tuple__"


def _flatten(obj: Any, key: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors[key] = obj.detach().cpu().contiguous()
        return {_TENSOR: key}
    if isinstance(obj, np.ndarray):
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj))
        return {_ARRAY: key}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {str(k): _flatten(v, f"{key}/{k}", tensors) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return {_TUPLE: [_flatten(v, f"{key}/{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_flatten(v, f"{key}/{i}", tensors) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(
        f"cannot save state value of type {type(obj).__name__} at '{key}': use tensors, arrays or plain data"
    )


def _unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if _TENSOR in obj:
            return tensors[obj[_TENSOR]]
        if _ARRAY in obj:
            return tensors[obj[_ARRAY]].numpy()
        if _TUPLE in obj:
            return tuple(_unflatten(v, tensors) for v in obj[_TUPLE])
        return {k: _unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    return obj


def save_state(state: dict[str, Any], directory: str | Path, name: str) -> None:
    """Write `name.json` and `name.safetensors` into `directory`."""
    directory = Path(directory)
    tensors: dict[str, torch.Tensor] = {}
    tree = _flatten(state, name, tensors)
    save_file(tensors, str(directory / f"{name}.safetensors"))
    (directory / f"{name}.json").write_text(json.dumps(tree))


def load_state(directory: str | Path, name: str) -> dict[str, Any]:
    directory = Path(directory)
    tensors = load_file(str(directory / f"{name}.safetensors"))
    return _unflatten(json.loads((directory / f"{name}.json").read_text()), tensors)


def fsync_dir(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
