"""The library's scan of a step's rows (first_max_rows, runtime/nc_rows.c): each row's first
largest value's index equals NumPy's argmax, and a row with a NaN or an infinity anywhere is
marked -1, at every level this CPU runs and every thread count; the batcher's rows carry the mark
and greedy sampling and the finiteness check read it (engine/rows.py)."""
import ctypes

import numpy as np
import pytest

from bench.support.tiny import random_weights, tiny_config
from nanocompile.engine.compiled import CompiledSession
from nanocompile.engine.rows import ScannedRow, argmax, known_first_max
from nanocompile.engine.stream import check_finite, greedy
from nanocompile.errors import InputError, NonFiniteLogitsError

pytestmark = pytest.mark.c

# three pieces of 8,192 columns, the last of 619: a vector tail of 616 and a scalar one of 3
VOCAB = 17003


@pytest.fixture(scope="module")
def wide_vocab():
    cfg = tiny_config(vocab=VOCAB, layers=1)
    return cfg, random_weights(cfg, seed=3)


def rows_to_scan(rng) -> list[np.ndarray]:
    """Random rows, and rows whose largest value is at the edges, in several places (ties) or a
    signed zero, where the first one wins."""
    rows = [rng.standard_normal(VOCAB).astype(np.float32) for _ in range(5)]
    for where in ([0], [VOCAB - 1], [8191], [8192], [VOCAB - 619], [5, 9000], [16400, VOCAB - 2],
                  [8, 9, 10, 11], [8199, 3, 16385]):
        row = -np.abs(rng.standard_normal(VOCAB)).astype(np.float32) - 1
        row[where] = 7.5
        rows.append(row)
    zeros = -np.abs(rng.standard_normal(VOCAB)).astype(np.float32) - 1
    zeros[[9001, 12000]] = np.float32(-0.0)
    zeros[[9100, 16999]] = np.float32(0.0)
    rows.append(zeros)  # -0 at 9001 comes first: NumPy's argmax takes it, +0 and -0 being equal
    rows.append(np.full(VOCAB, np.float32(-3.0e38)))
    return rows


def with_faults(rng) -> list[np.ndarray]:
    out = []
    for value in (np.nan, np.inf, -np.inf):
        for where in (0, 8191, 8192, VOCAB - 1, VOCAB - 3):
            row = rng.standard_normal(VOCAB).astype(np.float32)
            row[where] = value
            out.append(row)
    return out


@pytest.mark.levels
@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_first_max_is_numpys_argmax_and_minus_one_where_not_finite(wide_vocab, threads):
    cfg, w = wide_vocab
    session = CompiledSession.from_weights(cfg, w, n_ctx=16, threads=threads, precision="f32")
    rng = np.random.default_rng(threads)
    finite, faulty = rows_to_scan(rng), with_faults(rng)
    rows = [x for pair in zip(finite, faulty) for x in pair] + finite[len(faulty):] + faulty[len(finite):]
    marked = session.mark_first_max(rows)
    for row, got in zip(rows, marked):
        assert isinstance(got, ScannedRow) and np.shares_memory(got, row)
        want = int(np.argmax(row)) if np.isfinite(row).all() else -1
        assert got.first_max == want
    assert session.mark_first_max([]) == []
    assert [m.first_max for m in session.mark_first_max(rows[:1])] == [marked[0].first_max]


def test_only_whole_rows_of_logits_are_marked_and_what_is_made_from_them_is_not(wide_vocab):
    cfg, w = wide_vocab
    session = CompiledSession.from_weights(cfg, w, n_ctx=16, threads=2, precision="f32")
    rng = np.random.default_rng(0)
    row = rng.standard_normal(VOCAB).astype(np.float32)
    several = rng.standard_normal((3, VOCAB)).astype(np.float32)  # a verify step's rows: left as they are
    strided = rng.standard_normal(2 * VOCAB).astype(np.float32)[::2]
    out = session.mark_first_max([row, several, strided, row.astype(np.float64)])
    assert out[0].first_max == int(np.argmax(row))
    assert all(type(x) is np.ndarray for x in out[1:])
    for derived in (out[0][:], out[0].copy(), out[0] * 1, out[0][None][0]):
        assert derived.first_max is None and known_first_max(derived) is None
    # the sampler's and the loop's shortcuts read the mark, and only a finite row's
    assert greedy(out[0]) == argmax(out[0]) == int(np.argmax(row))
    assert check_finite(out[0], 1, "a step") is out[0]
    bad = row.copy()
    bad[100] = np.nan
    (bad_marked,) = session.mark_first_max([bad])
    assert bad_marked.first_max == -1 and known_first_max(bad_marked) is None
    with pytest.raises(NonFiniteLogitsError, match="1 NaN and 0 infinite"):
        check_finite(bad_marked, 1, "a step")


def test_the_scan_refuses_a_missing_row(wide_vocab):
    cfg, w = wide_vocab
    session = CompiledSession.from_weights(cfg, w, n_ctx=16, threads=2, precision="f32")
    row = np.zeros(VOCAB, np.float32)
    pointers = (ctypes.c_void_p * 2)(row.ctypes.data, None)
    found = np.empty(2, np.int32)
    with pytest.raises(InputError, match="first_max_rows: row 1 is NULL"):
        session._check(session.lib.first_max_rows(session._handle, pointers, 2, found.ctypes.data))
    with pytest.raises(InputError, match="first_max_rows: needs rows"):
        session._check(session.lib.first_max_rows(session._handle, pointers, -1, found.ctypes.data))
