"""A row of logits whose largest value the library has already found.

After a batched step the library finds, for every sequence's row at once and on its own threads,
the index of the row's first largest value, or that the row holds a NaN or an infinity
(CompiledSession.mark_first_max). Greedy sampling and the finiteness check then need not read the
151,936 floats again in Python, one sequence after another (docs/results/phase18.md)."""
from __future__ import annotations

import numpy as np


class ScannedRow(np.ndarray):
    """A row of logits as the step left it, with first_max: the index of its first largest value
    (NumPy's argmax), or -1 where a value is a NaN or an infinity. Arrays made from it (slices,
    copies, arithmetic) have first_max None: only the row itself was looked at. Nothing writes
    into a step's rows after the step; a caller that did would have to drop the mark."""
    first_max: int | None = None


def marked(row: np.ndarray, first_max: int) -> ScannedRow:
    out = row.view(ScannedRow)
    out.first_max = first_max
    return out


def known_first_max(logits: np.ndarray) -> int | None:
    """The row's first largest value's index if the library found it and the row is finite."""
    found = getattr(logits, "first_max", None)
    return found if found is not None and found >= 0 else None


def argmax(logits: np.ndarray) -> int:
    """np.argmax of a row, taken from the library's mark where it has one."""
    found = known_first_max(logits)
    return int(np.argmax(logits)) if found is None else found
