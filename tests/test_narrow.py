"""Five-bit weights (schedule/narrow.py): a GGUF's 5-bit values kept in 5 bits, read by 16-lane
dot products that rebuild them exactly; bitwise against the interpreter like every int8 kernel."""
import numpy as np
import pytest

from nanocompile.codegen.graph_library import GraphLibrary
from nanocompile.schedule import DotProduct, Pack, Parallel, ScheduleError, Split, UnrollJam, Vectorize, apply
from nanocompile.schedule.directives import Reorder
from nanocompile.schedule.narrow import narrow_bytes, widen_bytes
from nanocompile.schedule.pack import pack_array

from helpers import graph_kernels, require_lanes
from test_int8 import check_bitwise, projection_graph

pytestmark = pytest.mark.c


def five_bit_weights(k, n, seed=0):
    """int8 weights within [-16, 15] (a Q5_0 block's values, scales aside), the extremes included."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-16, 16, (n, k)).astype(np.int8)
    q[0, :] = -16
    q[1, :] = 15
    return {"wq": q, "wd": (rng.random((n, k // 32)) * 0.01 + 0.001).astype(np.float16)}


def test_five_bits_round_trip_and_refuse_a_sixth():
    stored = np.random.default_rng(0).integers(0, 32, 64 * 5).astype(np.uint8)
    narrow = narrow_bytes(stored)
    assert narrow.size == 40 * 5 and np.array_equal(widen_bytes(narrow), stored)
    assert narrow[0] == (stored[0] & 15) | ((stored[32] & 15) << 4) and narrow[32] & 1 == stored[0] >> 4
    with pytest.raises(ValueError, match="does not fit in 5 bits"):
        narrow_bytes(np.full(64, 32, np.uint8))
    w = five_bit_weights(64, 32)["wq"]
    assert np.array_equal(pack_array(w, 64, 32, 4, 16, 5), narrow_bytes(pack_array(w, 64, 32, 4, 16)))
    with pytest.raises(ValueError, match="leave an unsigned byte"):
        pack_array(np.full((32, 64), -17, np.int8), 64, 32, 4, 16, 5)


@pytest.mark.parametrize("columns, rows", [(1, 0), (4, 0), (2, 3), (4, 3)])
def test_five_bit_dot_kernels_are_bitwise(columns, rows):
    """Column vectors and row tiles as the recipes make them, on widths with a shorter last block
    (70: the padding's zeros are stored as 16 and subtracted back), at 1, 2, 3 and 8 threads."""
    require_lanes(16)
    g = projection_graph(70, 128)
    w = five_bit_weights(96, 128, seed=columns)
    w["wq"][:, 70:] = 0  # the graph's padding: zeros past the row's end
    tile = [Reorder("i0", "i1"), Split("i0", rows), UnrollJam("i0i", rows)] if rows else []
    schedule = tuple([Vectorize("i1", 16), DotProduct("j", 4)] + ([UnrollJam("i1", columns)] if columns > 1 else []) +
                     [Pack("p2", 96, 16 * columns, 4, 16, 5), Pack("p4", 3, 16 * columns)] + tile + [Parallel("i1")])
    lib = GraphLibrary(g, fuse=True, schedule=lambda k: schedule if k.op == "block_matmul" else ())
    assert "nc_dot4u5_16(" in lib.source and "nc_dot4u_16(" not in lib.source
    check_bitwise(lib, g, w, np.random.default_rng(columns + rows))


def test_five_bit_weights_read_outside_dot_products_are_rebuilt_byte_by_byte():
    """Scalar code (the plain products, as a tied embedding's gather reads the table) rebuilds
    each stored byte (nc_load_u5) and subtracts the offset: bitwise as before."""
    g = projection_graph(70, 48)
    w = five_bit_weights(96, 48, seed=6)
    w["wq"][:, 70:] = 0
    plain = (Pack("p2", 96, 16, 4, 16, 5), Parallel("i1"))
    lib = GraphLibrary(g, fuse=True, schedule=lambda k: plain if k.op == "block_matmul" else ())
    assert "nc_load_u5(" in lib.source
    check_bitwise(lib, g, w, np.random.default_rng(7), threads=(1, 3))


def test_five_bits_are_read_by_sixteen_lane_dot_products_only():
    g = projection_graph(64, 64)
    k = next(k for k in graph_kernels(g).values() if k.op == "block_matmul")
    with pytest.raises(ScheduleError, match="outside a dot product"):
        apply(k, (Vectorize("i1", 16), Pack("p2", 64, 16, 1, 16, 5)))
    with pytest.raises(ScheduleError, match="blocks of a multiple of 16 rows"):  # 8 lanes: 32-byte units
        apply(k, (Vectorize("i1", 8), DotProduct("j", 4), Pack("p2", 64, 8, 4, 16, 5), Pack("p4", 2, 8)))
    with pytest.raises(ScheduleError, match="only 5, with groups of 4, an offset"):
        apply(k, (Vectorize("i1", 16), DotProduct("j", 4), Pack("p2", 64, 16, 4, 0, 5)))
    text = "\n".join(str(d) for d in apply(k, (Vectorize("i1", 16), DotProduct("j", 4),
                                               Pack("p2", 64, 16, 4, 16, 5), Pack("p4", 2, 16))).schedule)
    assert "Pack(p2, 64, 16, 4, offset=16, bits=5)" in text
