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
from typing import Callable, NamedTuple

import numpy as np

from ..cache import sources
from ..errors import ModelError
from .formats import BlockFormat, check_finite_scales, format_named


class StoredBlocks(NamedTuple):
    """A tensor as its file stores it, for a precision that runs the file's own blocks."""
    data: np.ndarray  # [rows, blocks per row, bytes per block]; [rows, bytes per row] if format is None
    format: BlockFormat | None  # None: a type with no description in nanocompile.formats
    type_name: str  # the ggml type's name: Q4_K, F32, ...


class WeightSource(Mapping):
    def __init__(self, shapes: dict[str, tuple[int, ...]], convert: Callable[[str], np.ndarray], where: str,
                 content_key: str | None = None, tensor_label: Callable[[str], str] | None = None,
                 raw: Callable[[str], tuple[str, np.ndarray]] | None = None, types: dict[str, str] | None = None,
                 convertible: Callable[[str], None] | None = None):
        """shapes: every tensor's name and shape; convert(name): that tensor as float32; where: the
        file or directory, for messages; content_key: the source's content hash, under which the
        finite check is recorded; tensor_label(name): the tensor's name in the file's own terms;
        raw(name): the tensor as stored (a GGUF's ggml type name and its bytes), for a precision
        that packs the file's own blocks; types: each tensor's stored type name, from the file's
        tensor table (what raw(name)[0] says, without mapping the bytes); convertible(name): raises
        ModelError if convert(name) would, without converting (check_convertible)."""
        self.shapes = dict(shapes)
        self._types = types
        self._convert = convert
        self._raw = raw
        self._convertible = convertible
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

    def check_convertible(self, name: str) -> None:
        """ModelError now if the tensor cannot be converted to float32 (its type has no reader):
        a weight form that will convert it says so before anything else."""
        if name not in self.shapes:
            raise KeyError(name)
        if self._convertible is not None:
            self._convertible(name)

    def raw(self, name: str) -> tuple[str, np.ndarray]:
        """The tensor as the file stores it: (its ggml type name, its bytes as uint8 rows), with
        no conversion and no check; ModelError if the source has no such form (not a GGUF)."""
        if name not in self.shapes:
            raise KeyError(name)
        if self._raw is None:
            raise ModelError(f"{self.where}: its tensors have no stored form other than float32")
        return self._raw(name)

    def stored_type(self, name: str) -> str:
        """The tensor's type as the file stores it (F32, Q8_0, Q4_K, ...); ModelError if the source
        has no stored form other than float32."""
        if self._types is not None and name in self._types:
            return self._types[name]
        return self.raw(name)[0]

    def blocks(self, name: str) -> StoredBlocks:
        """The tensor's stored blocks with their format (nanocompile.formats), mapped from the file,
        not converted. Unless this content is known finite, every block's float scales are checked
        (a ModelError names the tensor and the block): finite scales are exactly finite weights
        for these formats, since a non-finite scale times any quant, zero included, is not finite."""
        type_name, rows = self.raw(name)
        fmt = format_named(type_name)
        if fmt is None:
            return StoredBlocks(rows, None, type_name)
        if rows.shape[1] % fmt.nbytes:
            raise ModelError(f"{self.where}: tensor {self._label(name)} has {rows.shape[1]} bytes per row, not whole "
                             f"{type_name} blocks of {fmt.nbytes} bytes")
        data = rows.reshape(rows.shape[0], -1, fmt.nbytes)
        if not self.known_finite:
            check_finite_scales(fmt, data, f"{self._label(name)} in {self.where}")
        return StoredBlocks(data, fmt, type_name)

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
