"""Narrow weights (schedule/narrow.py): a GGUF's 5-bit values kept in 5 bits (and values that fit
4 or 6 bits in 4 or 6), read by 16-lane dot products (a 64-byte unit) and 8-lane ones (half a
unit: AVX2 and AVX-VNNI) that rebuild them exactly; bitwise against the interpreter like every int8
kernel, at every level this CPU runs."""
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import calls_narrow_dot, check_bitwise, graph_kernels, projection_graph, use_target

from nanocompile.compiler.graph_library import GraphLibrary
from nanocompile.schedule import DotProduct, Pack, Parallel, ScheduleError, Split, UnrollJam, Vectorize, apply
from nanocompile.schedule.blocking import pack_array
from nanocompile.schedule.directives import Reorder, Unpack
from nanocompile.schedule.narrow import narrow_bytes, widen_bytes
from nanocompile.schedule.unpack import min_tiles
from nanocompile.target import vector_lanes

pytestmark = pytest.mark.c


def narrow_weights(k, n, seed=0, low=-16, high=15):
    """int8 weights within [low, high] (by default a Q5_0 block's values, scales aside), the
    extremes included."""
    rng = np.random.default_rng(seed)
    q = rng.integers(low, high + 1, (n, k)).astype(np.int8)
    q[0, :] = low
    q[1, :] = high
    return {"wq": q, "wd": (rng.random((n, k // 32)) * 0.01 + 0.001).astype(np.float16)}


# (bits, offset, the values' range): 4 bits as they are (offset 0) and as a Q4_0's [-8, 7] + 8,
# 5 bits as a Q5_0's, 6 bits as a Q6_K's [-32, 31] + 32
NARROW = [(4, 0, 0, 15), (4, 8, -8, 7), (5, 16, -16, 15), (6, 32, -32, 31)]


def test_five_bits_round_trip_and_refuse_a_sixth():
    stored = np.random.default_rng(0).integers(0, 32, 64 * 5).astype(np.uint8)
    narrow = narrow_bytes(stored)
    assert narrow.size == 40 * 5 and np.array_equal(widen_bytes(narrow), stored)
    assert narrow[0] == (stored[0] & 15) | ((stored[32] & 15) << 4) and narrow[32] & 1 == stored[0] >> 4
    with pytest.raises(ValueError, match="does not fit in 5 bits"):
        narrow_bytes(np.full(64, 32, np.uint8))
    w = narrow_weights(64, 32)["wq"]
    assert np.array_equal(pack_array(w, 64, 32, 4, 16, 5), narrow_bytes(pack_array(w, 64, 32, 4, 16)))
    with pytest.raises(ValueError, match="leave an unsigned byte"):
        pack_array(np.full((32, 64), -17, np.int8), 64, 32, 4, 16, 5)


@pytest.mark.parametrize("bits", [4, 6])
def test_four_and_six_bits_round_trip_and_refuse_a_bit_more(bits):
    rng = np.random.default_rng(bits)
    stored = rng.integers(0, 1 << bits, 64 * 5).astype(np.uint8)
    narrow = narrow_bytes(stored, bits)
    assert narrow.size == 8 * bits * 5 and np.array_equal(widen_bytes(narrow, bits), stored)
    unit = 8 * bits  # the second unit's bytes: nibbles of 64 + j and 96 + j, high bits of 64 + i, 80 + i, ...
    assert narrow[0] == (stored[0] & 15) | ((stored[32] & 15) << 4)
    assert narrow[unit + 31] == (stored[64 + 31] & 15) | ((stored[64 + 63] & 15) << 4)
    if bits == 6:
        for u, i in [(0, 0), (0, 15), (1, 7)]:
            high = [stored[64 * u + i + 16 * q] >> 4 for q in range(4)]
            assert narrow[unit * u + 32 + i] == high[0] | high[1] << 2 | high[2] << 4 | high[3] << 6
    with pytest.raises(ValueError, match=f"does not fit in {bits} bits"):
        narrow_bytes(np.full(64, 1 << bits, np.uint8), bits)
    offset = 1 << (bits - 1)
    w = narrow_weights(64, 32, low=-offset, high=offset - 1)["wq"]
    assert np.array_equal(pack_array(w, 64, 32, 4, offset, bits), narrow_bytes(pack_array(w, 64, 32, 4, offset), bits))
    with pytest.raises(ValueError, match=f"does not fit in {bits} bits"):  # offset past the range
        pack_array(np.full((32, 64), offset, np.int8), 64, 32, 4, offset, bits)
    # without an offset the values are the stored bytes: within [0, 2**bits - 1] only
    w = narrow_weights(64, 32, low=0, high=(1 << bits) - 1)["wq"]
    assert np.array_equal(pack_array(w, 64, 32, 4, 0, bits), narrow_bytes(pack_array(w, 64, 32, 4), bits))
    for value in (-1, 1 << bits):
        with pytest.raises(ValueError, match=f"do not fit in {bits} bits without an offset"):
            pack_array(np.full((32, 64), value, np.int8), 64, 32, 4, 0, bits)
    with pytest.raises(ValueError, match="4, 5 or 6; not 3"):
        pack_array(w, 64, 32, 4, 0, 3)


@pytest.mark.parametrize("columns, rows", [(1, 0), (4, 0), (2, 3), (4, 3)])
@pytest.mark.parametrize("bits, offset, low, high", NARROW)
@pytest.mark.parametrize("march", ["x86-64-v4+vnni", "x86-64-v4", "x86-64-v3+vnni", "x86-64-v3"])
def test_narrow_dot_kernels_are_bitwise(march, bits, offset, low, high, columns, rows, monkeypatch):
    """Column vectors and row tiles as the recipes make them, on widths with a shorter last block
    (70: the padding's zeros are stored as the offset and subtracted back), at 1, 2, 3 and 8
    threads; without an offset nothing is subtracted. At every level with vector dot products:
    vpdpbusd (VNNI) or vpmaddubsw multiplies the rebuilt bytes, at 16 lanes and at 8."""
    use_target(march, monkeypatch)
    lanes = vector_lanes(march)
    g = projection_graph(70, 128)
    w = narrow_weights(96, 128, seed=columns, low=low, high=high)
    w["wq"][:, 70:] = 0  # the graph's padding: zeros past the row's end
    tile = [Reorder("i0", "i1"), Split("i0", rows), UnrollJam("i0i", rows)] if rows else []
    schedule = tuple([Vectorize("i1", lanes), DotProduct("j", 4)] + ([UnrollJam("i1", columns)] if columns > 1 else [])
                     + [Pack("p2", 96, lanes * columns, 4, offset, bits), Pack("p4", 3, lanes * columns)] + tile +
                     [Parallel("i1")])
    lib = GraphLibrary(g, fuse=True, schedule=lambda k: schedule if k.op == "block_matmul" else ())
    assert calls_narrow_dot(lib.source, bits, lanes) and f"nc_dot4u_{lanes}(" not in lib.source
    assert ("nc_sum_i8(" in lib.source) == bool(offset)  # the offset's correction
    check_bitwise(lib, g, w, np.random.default_rng(columns + rows))


@pytest.mark.parametrize("bits, offset, low, high", NARROW)
def test_narrow_weights_read_outside_dot_products_are_rebuilt_byte_by_byte(bits, offset, low, high):
    """Scalar code (the plain products, as a tied embedding's gather reads the table) rebuilds
    each stored byte (nc_load_u4, nc_load_u5, nc_load_u6) and subtracts the offset, if any: bitwise
    as before."""
    g = projection_graph(70, 48)
    w = narrow_weights(96, 48, seed=6, low=low, high=high)
    w["wq"][:, 70:] = 0
    plain = (Pack("p2", 96, 16, 4, offset, bits), Parallel("i1"))
    lib = GraphLibrary(g, fuse=True, schedule=lambda k: plain if k.op == "block_matmul" else ())
    assert f"nc_load_u{bits}(" in lib.source
    check_bitwise(lib, g, w, np.random.default_rng(7), threads=(1, 3))


def test_narrow_bits_are_read_by_vector_dot_products_only():
    g = projection_graph(64, 64)
    k = next(k for k in graph_kernels(g).values() if k.op == "block_matmul")
    with pytest.raises(ScheduleError, match="outside a dot product"):
        apply(k, (Vectorize("i1", 16), Pack("p2", 64, 16, 1, 16, 5)))
    with pytest.raises(ScheduleError, match="blocks of a multiple of 8 rows"):  # a dot product reads 32 bytes or 64
        apply(k, (DotProduct("j", 4), Pack("p2", 64, 4, 4, 16, 5), Pack("p4", 2, 4)))
    with pytest.raises(ScheduleError, match="only 4, 5 or 6, with groups of 4"):
        apply(k, (Vectorize("i1", 16), DotProduct("j", 4), Pack("p2", 64, 16, 4, 16, 3)))
    with pytest.raises(ScheduleError, match="only 4, 5 or 6, with groups of 4"):
        apply(k, (Pack("p2", 64, 16, 1, 0, 4),))
    with pytest.raises(ScheduleError, match="in 4 bits is read by dot products in 8 or 16 lanes only"):  # scalar
        apply(k, (DotProduct("j", 4), Pack("p2", 64, 16, 4, 0, 4)))
    with pytest.raises(ScheduleError, match="in 6 bits is read by dot products in 8 or 16 lanes only"):
        apply(k, (DotProduct("j", 4), Pack("p2", 64, 8, 4, 32, 6)))
    text = "\n".join(str(d) for d in apply(k, (Vectorize("i1", 8), DotProduct("j", 4),
                                               Pack("p2", 64, 8, 4, 16, 5), Pack("p4", 2, 8))).schedule)
    assert "Pack(p2, 64, 8, 4, offset=16, bits=5)" in text
    text = "\n".join(str(d) for d in apply(k, (Vectorize("i1", 16), DotProduct("j", 4),
                                               Pack("p2", 64, 16, 4, 16, 5), Pack("p4", 2, 16))).schedule)
    assert "Pack(p2, 64, 16, 4, offset=16, bits=5)" in text
    text = "\n".join(str(d) for d in apply(k, (Vectorize("i1", 16), DotProduct("j", 4),
                                               Pack("p2", 64, 16, 4, 0, 4), Pack("p4", 2, 16))).schedule)
    assert "Pack(p2, 64, 16, 4, bits=4)" in text


@pytest.mark.parametrize("bits, offset, low, high", [(4, 8, -8, 7), (5, 16, -16, 15), (6, 32, -32, 31)])
@pytest.mark.parametrize("columns, rows", [(1, 2), (2, 3)])
@pytest.mark.parametrize("march", ["x86-64-v4+vnni", "x86-64-v3"])
def test_unpacked_bytes_are_read_by_the_row_tiles_bitwise(march, bits, offset, low, high, columns, rows, monkeypatch):
    """Unpack rebuilds each column block's narrow bytes once before the row tiles (a local
    array), which then read them in 8 bits (nc_dot4us), when there are at least min_tiles tiles
    (2 at 16 lanes, 3 at 8); fewer tiles (a 2-3 row step, an 8-row one at 8 lanes), the tail rows
    past the last tile and a chunk with no whole tile read the narrow storage. Bitwise at every
    row count from 1 to 10 (tiles of 2 and 3: 0 to 5 tiles, tails of 0, 1 and 2 rows), at 1, 2, 3
    and 8 threads, at 16 lanes and 8."""
    use_target(march, monkeypatch)
    lanes = vector_lanes(march)
    g = projection_graph(70, 128)
    w = narrow_weights(96, 128, seed=rows, low=low, high=high)
    w["wq"][:, 70:] = 0
    schedule = tuple([Vectorize("i1", lanes), DotProduct("j", 4)] + ([UnrollJam("i1", columns)] if columns > 1 else [])
                     + [Pack("p2", 96, lanes * columns, 4, offset, bits), Pack("p4", 3, lanes * columns),
                        Reorder("i0", "i1"), Split("i0", rows), UnrollJam("i0i", rows), Parallel("i1"),
                        Unpack("p2", "i0o")])
    lib = GraphLibrary(g, fuse=True, schedule=lambda k: schedule if k.op == "block_matmul" else ())
    src = lib.source
    assert f"nc_unpack{bits}_{lanes}(" in src and f"nc_dot4us_{lanes}(" in src
    assert calls_narrow_dot(src, bits, lanes)  # the tail rows
    # unpacked only with MIN_TILES tiles or more; the copy of the tiles for fewer reads the narrow storage
    fewest = min_tiles(lanes)
    assert fewest == {16: 2, 8: 3}[lanes] and f"if ((seq / {rows}) - {fewest - 1} > 0)" in src
    assert f"i0o < (((seq / {rows}) < {fewest}) ? 0 : (seq / {rows}))" in src
    assert f"i0o < (((seq / {rows}) < {fewest}) ? (seq / {rows}) : 0)" in src
    # the tiles' loops of dot products on the unpacked bytes are unrolled (their sums stay in registers)
    pragmas = re.findall(r"(#pragma GCC unroll \d+\n *)?for \(int64_t j = 0; j < \d+; \+\+j\) \{\n *\w+ = nc_dot4us_", src)
    assert pragmas and all(pragmas)
    check_bitwise(lib, g, w, np.random.default_rng(rows), kinds=("normal", "outlier"),
                  envs=[{"seq": seq, "past": 0} for seq in range(1, 11)])


def test_unpack_refuses_what_it_cannot_rebuild_once():
    g = projection_graph(64, 64)
    k = next(k for k in graph_kernels(g).values() if k.op == "block_matmul")
    head = (Vectorize("i1", 16), DotProduct("j", 4), Pack("p2", 64, 16, 4, 16, 5), Pack("p4", 2, 16))
    tile = (Reorder("i0", "i1"), Split("i0", 2), UnrollJam("i0i", 2))
    with pytest.raises(ScheduleError, match="no loop 'x'"):
        apply(k, head + tile + (Unpack("p2", "x"),))
    with pytest.raises(ScheduleError, match="no vector dot product inside 'i0o' reads p2 in 4, 5 or 6 bits"):
        apply(k, head[:2] + tile + (Unpack("p2", "i0o"),))  # p2 in 8 bits
    with pytest.raises(ScheduleError, match="index changes with 'i1'"):  # the columns inside: no one block
        apply(k, head + (Unpack("p2", "i1"),))
    text = "\n".join(str(d) for d in apply(k, head + tile + (Unpack("p2", "i0o"),)).schedule)
    assert "Unpack(p2, i0o)" in text
    # a column block deeper than a kernel rebuilds at once: refused once the schedule is complete
    # (AmxSums, which drops the array, is what makes such an Unpack legal: test_native.py)
    deep = next(k for k in graph_kernels(projection_graph(16416, 64)).values() if k.op == "block_matmul")
    with pytest.raises(ScheduleError, match=r"Unpack\(p2\): 262656 bytes rebuilt at once \(at most 262144\)"):
        apply(deep, (Vectorize("i1", 16), DotProduct("j", 4), Pack("p2", 16416, 16, 4, 16, 5), Pack("p4", 513, 16))
              + tile + (Unpack("p2", "i0o"),))


def test_a_narrow_index_is_split_into_its_unit_and_a_known_half():
    """At 8 lanes a dot product reads half a 64-byte unit: the C is given the unit's index and the
    half apart (a literal, or the parity of the one loop variable stepping by an odd multiple of
    32, whose loop GCC then unrolls), so the half is never found from the index at run time."""
    from nanocompile.codegen.cexpr import split_half
    from nanocompile.loopir.ir import Bin, IConst, Var

    def value(e, env):
        if isinstance(e, IConst):
            return e.value
        if isinstance(e, Var):
            return env[e.name]
        a, b = value(e.a, env), value(e.b, env)
        return {"+": int.__add__, "*": int.__mul__, "/": int.__floordiv__, "%": int.__mod__}[e.op](a, b)

    i1, b, j = Var("i1"), Var("b"), Var("j")
    for terms, const in (({i1: 4096, b: 256, j: 64}, 32), ({i1: 4096, j: 64}, 0), ({i1: 7168, b: 256, j: 32}, 0),
                         ({i1: 4480, j: 96}, 64)):
        unit, half = split_half(terms, const)
        assert isinstance(half, IConst) == all(k % 64 == 0 for k in terms.values())
        for env in ({"i1": 3, "b": 5, "j": 0}, {"i1": 1, "b": 2, "j": 3}, {"i1": 0, "b": 0, "j": 7}):
            index = sum(k * env[a.name] for a, k in terms.items()) + const
            assert value(unit, env) % 64 == 0 and value(unit, env) + 32 * value(half, env) == index
    assert split_half({j: 16}, 0) is None  # a quarter unit: not a half
    assert split_half({i1: 32, j: 32}, 0) is None  # two parities
    assert split_half({j: 32}, 32) is None
    assert split_half({j: -32}, 64) is None  # a parity of a negative step: not split


@pytest.mark.parametrize("bits", [4, 5, 6])
def test_unpack_at_eight_lanes_rebuilds_any_span_of_half_units(bits, tmp_path, monkeypatch):
    """nc_unpack{bits}_8 rebuilds units whole, both halves with literal halves, and a lone half
    first or last where the span starts or ends mid-unit: every start and length in halves
    (multiples of 32 bytes) gives the 8-bit bytes narrow_bytes was given."""
    import subprocess

    use_target("x86-64-v3", monkeypatch)
    from nanocompile.target import compiler_flags

    rng = np.random.default_rng(bits)
    units = 6
    plain = rng.integers(0, 1 << bits, units * 64, dtype=np.uint8)
    narrow = narrow_bytes(plain, bits)
    runtime = Path(__file__).resolve().parents[1] / "runtime"
    (tmp_path / "narrow.bin").write_bytes(narrow.tobytes())
    (tmp_path / "unpack.c").write_text(f"""
#include <stdio.h>
#include "nc_vector.h"
int main(void) {{
    static int8_t p[{narrow.size}], dst[{units * 64}] __attribute__((aligned(64)));
    FILE *f = fopen("{tmp_path / 'narrow.bin'}", "rb");
    if (fread(p, 1, sizeof p, f) != sizeof p) return 1;
    for (int64_t i = 0; i < {units * 64}; i += 32)
        for (int64_t n = 0; i + n <= {units * 64}; n += 32) {{
            memset(dst, 0x55, sizeof dst);
            nc_unpack{bits}_8(dst, p, i, n);
            fwrite(dst, 1, sizeof dst, stdout);
        }}
    return 0;
}}
""")
    exe = tmp_path / "unpack"
    subprocess.run(["gcc", "-O2", *compiler_flags("x86-64-v3"), f"-I{runtime}", str(tmp_path / "unpack.c"),
                    "-o", str(exe)], check=True)
    out = np.frombuffer(subprocess.run([str(exe)], capture_output=True, check=True).stdout, np.uint8)
    out = out.reshape(-1, units * 64)
    row = 0
    for i in range(0, units * 64, 32):
        for n in range(0, units * 64 - i + 1, 32):
            want = np.full(units * 64, 0x55, np.uint8)
            want[:n] = plain[i:i + n]
            assert np.array_equal(out[row], want), (i, n)
            row += 1
    assert row == len(out)


@pytest.mark.parametrize("bits, offset", [(8, 0), (8, 128), (4, 8), (5, 16), (6, 32), (4, 0)])
def test_pack_array_by_slabs_equals_all_at_once(monkeypatch, bits, offset):
    """pack_array packs a few blocks of rows at a time (a 151936-row embedding's temporaries were
    four times its size); the bytes are those of one pass over every row, down to an uneven last
    slab, in every width and with and without an offset."""
    import nanocompile.schedule.blocking as blocking

    low, high = (-offset, min(127, (1 << bits) - 1 - offset)) if offset or bits == 8 else (0, (1 << bits) - 1)
    w = np.random.default_rng(bits + offset).integers(low, high + 1, (32 * 7, 128)).astype(np.int8)
    whole = pack_array(w, 128, 32, 4, offset, bits)
    monkeypatch.setattr(blocking, "SLAB_ELEMENTS", 3 * 32 * 128)  # slabs of 3 blocks: 3, 3, then 1
    assert np.array_equal(pack_array(w, 128, 32, 4, offset, bits), whole)
    assert whole.size == w.size * bits // 8
