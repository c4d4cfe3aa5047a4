"""A model's weights as a read-only mapping, in transformers' names, float32, converted from the
model file one tensor at a time when asked.

Packing reads each tensor once through tensor() and keeps none, so the weights in a compiled
library's layout are made straight from the file, one tensor in memory at a time, with no
float32 copy of the whole model in memory or on disk. Indexing (weights[name]) keeps what it
converted, for the interpreter and the oracle, which read every weight at every step.

Every converted tensor is checked for NaN and Inf unless the model's content is recorded as
checked (cache/sources.py): the check runs once per model file, when its weights are first
converted, and a non-finite weight is an error naming the tensor.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Callable

import numpy as np

from ..cache import sources
from ..errors import ModelError


class WeightSource(Mapping):
    def __init__(self, shapes: dict[str, tuple[int, ...]], convert: Callable[[str], np.ndarray], where: str,
                 content_key: str | None = None, tensor_label: Callable[[str], str] | None = None,
                 raw: Callable[[str], tuple[str, np.ndarray]] | None = None):
        """shapes: every tensor's name and shape; convert(name): that tensor as float32; where: the
        file or directory, for messages; content_key: the source's content hash, under which the
        finite check is recorded; tensor_label(name): the tensor's name in the file's own terms;
        raw(name): the tensor as stored (a GGUF's ggml type name and its bytes), for a precision
        that packs the file's own blocks."""
        self.shapes = dict(shapes)
        self._convert = convert
        self._raw = raw
        self.where = where
        self.content_key = content_key
        self._label = tensor_label or (lambda name: repr(name))
        self._kept: dict[str, np.ndarray] = {}
        self._checked: set[str] = set()
        self.known_finite = bool(content_key and sources.checked(content_key).get("finite"))

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], where: str = "weights") -> "WeightSource":
        if isinstance(arrays, WeightSource):
            return arrays
        return cls({k: tuple(v.shape) for k, v in arrays.items()}, arrays.__getitem__, where)

    def tensor(self, name: str) -> np.ndarray:
        """The tensor converted now, and not kept."""
        if name not in self.shapes:
            raise KeyError(name)
        array = self._kept.get(name)
        if array is None:
            array = self._convert(name)
            self._check_finite(name, array)
        return array

    def raw(self, name: str) -> tuple[str, np.ndarray]:
        """The tensor as the file stores it: (its ggml type name, its bytes as uint8 rows), with
        no conversion and no check; ModelError if the source has no such form (not a GGUF)."""
        if name not in self.shapes:
            raise KeyError(name)
        if self._raw is None:
            raise ModelError(f"{self.where}: its tensors have no stored form other than float32")
        return self._raw(name)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._kept:
            self._kept[name] = self.tensor(name)
        return self._kept[name]

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def __contains__(self, name) -> bool:
        return name in self.shapes

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(s, dtype=np.int64)) for s in self.shapes.values())

    def materialize(self, progress=None) -> "WeightSource":
        """Converts (and keeps) every tensor now, so a bad weight is refused before a run starts."""
        for name in self.shapes:
            self[name]
            if progress is not None:
                progress(int(np.prod(self.shapes[name], dtype=np.int64)) * 4)
        return self

    def _check_finite(self, name: str, array: np.ndarray) -> None:
        if self.known_finite or name in self._checked:
            return
        finite = np.isfinite(array)
        if not finite.all():
            bad = np.flatnonzero(~finite.ravel())
            index = [int(i) for i in np.unravel_index(bad[0], array.shape)]
            raise ModelError(f"{self.where}: tensor {self._label(name)} has {bad.size} NaN or Inf value(s), "
                             f"the first at {index} ({array.ravel()[bad[0]]})")
        self._checked.add(name)
        if len(self._checked) == len(self.shapes):
            self.known_finite = True
            if self.content_key:
                sources.record_checked(self.content_key, finite=True)
