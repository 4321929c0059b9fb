"""Save nested state (tensors, numpy arrays, plain data) as safetensors + JSON.

Checkpoints never unpickle: every tensor or array goes into one safetensors file under a
path-like key, and everything else into a JSON file that points at those keys. Tuples and
dicts with non-string keys (int question ids, optimizer parameter indices) are tagged, so
they load back as what they were: a resumed run must see the same state, not its JSON shadow.
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
_ITEMS = "__items__"  # a dict whose keys are not all strings: [[key, value], ...]
_SCALARS = (bool, int, float, str)


class _Writer:
    """Collects the tensors of one state under unique keys, none sharing memory (safetensors refuses that)."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._storages: set[int] = set()

    def add(self, key: str, tensor: torch.Tensor) -> str:
        while key in self.tensors:  # "a/b" may be both a key with a slash and a nested key
            key += "'"
        tensor = tensor.detach().cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        if storage in self._storages and tensor.numel():
            tensor = tensor.clone()
        self._storages.add(storage)
        self.tensors[key] = tensor
        return key

    def flatten(self, obj: Any, key: str) -> Any:
        if isinstance(obj, torch.Tensor):
            return {_TENSOR: self.add(key, obj)}
        if isinstance(obj, np.ndarray):
            if obj.dtype == object or obj.dtype.kind in "USV":
                raise TypeError(f"cannot save a numpy array of dtype {obj.dtype} at '{key}': use numbers or lists")
            return {_ARRAY: self.add(key, torch.from_numpy(np.ascontiguousarray(obj)))}
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, dict):
            if all(isinstance(k, str) for k in obj) and not {_TENSOR, _ARRAY, _TUPLE, _ITEMS} & set(obj):
                return {k: self.flatten(v, f"{key}/{k}") for k, v in obj.items()}
            return {_ITEMS: [[self.flatten(k, f"{key}/key{i}"), self.flatten(v, f"{key}/{i}")]
                             for i, (k, v) in enumerate(obj.items())]}
        if isinstance(obj, tuple):
            return {_TUPLE: [self.flatten(v, f"{key}/{i}") for i, v in enumerate(obj)]}
        if isinstance(obj, list):
            return [self.flatten(v, f"{key}/{i}") for i, v in enumerate(obj)]
        if obj is None or isinstance(obj, _SCALARS):
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
        if _ITEMS in obj:
            return {_hashable(_unflatten(k, tensors)): _unflatten(v, tensors) for k, v in obj[_ITEMS]}
        return {k: _unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    return obj


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def save_state(state: dict[str, Any], directory: str | Path, name: str) -> None:
    """Write `name.json` and `name.safetensors` into `directory`.

    Raises TypeError naming the path of a value that is neither a tensor, an array, nor plain
    data (None, bool, int, float, str, list, tuple, dict), so nothing needs pickle to load.
    """
    directory = Path(directory)
    writer = _Writer()
    tree = writer.flatten(state, name)
    save_file(writer.tensors, str(directory / f"{name}.safetensors"))
    (directory / f"{name}.json").write_text(json.dumps(tree))


def load_state(directory: str | Path, name: str) -> dict[str, Any]:
    """Read what save_state wrote: safetensors (no code runs) and JSON only, never pickle."""
    directory = Path(directory)
    tensors = load_file(str(directory / f"{name}.safetensors"))
    return _unflatten(json.loads((directory / f"{name}.json").read_text()), tensors)


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (a rename, a new file) to disk."""
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """Flush every file under `path` and every directory entry, so a rename publishes complete data."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(root))
