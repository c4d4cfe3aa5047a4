"""superblock_matmul: the K formats (Q2_K .. Q6_K) run as stored, with integer sub-scales and
sub-mins under float16 super-scales. The interpreter is the definition (docs/PRIMITIVES.md); its
integer parts are exact, so every kernel is bitwise equal to it: the scalar form, the recipe at
every target this CPU runs, and the quants kept in the fewest bits the format allows (4, 5 or 6,
schedule/narrow.py) where 16 lanes take them, at 1, 2, 3 and 8 threads with guard regions."""
import numpy as np
import pytest
from helpers import TARGETS, THREADS, activations, graph_kernels, make_graph, narrow_dot_call, superblock_values, use_target

from nanocompile.compiler.graph_library import GraphLibrary
from nanocompile.frontend import nn
from nanocompile.ir import SEQ, interpreter
from nanocompile.ir.graph import GraphBuilder
from nanocompile.ir.ops import IRError
from nanocompile.models.formats import dequantize, format_named
from nanocompile.models.quantize import narrow_storage, split_superblocks, superblock_form, superblock_parts
from nanocompile.schedule.recipes import _superblock_column_loop, _superblock_operands, superblock_projection
from nanocompile.target import dot_weight_offset, vector_lanes

pytestmark = pytest.mark.c

K_FORMATS = ["Q4_K", "Q6_K", "Q5_K", "Q3_K", "Q2_K", "Q4_1", "Q5_1"]  # Q4_1, Q5_1: a super-block of one sub-block
DTYPES = {"qs": "i8", "sc": "i8", "d": "f16", "mn": "i8", "dmin": "f16"}


def superblock_graph(fmt, k, n):
    """x f32[seq, k] quantized in blocks of the format's sub-block, times a [n, k] weight in the
    format's parts (weights named as the parts): the product and the quantized activations."""
    shapes = {"qs": [n, k], "sc": [n, k // fmt.sub], "d": [n, k // fmt.block], "mn": [n, k // fmt.sub],
              "dmin": [n, k // fmt.block]}

    def build(b):
        x = b.input("x", [SEQ, k])
        w = {p: b.weight(p, shapes[p], DTYPES[p]) for p in superblock_parts(fmt)}
        y = nn.linear_k(b, x, w["qs"], w["sc"], w["d"], w.get("mn"), w.get("dmin"))
        return [y]

    return make_graph(f"{fmt.name}_{k}x{n}", build)


def random_blocks(fmt, rows, k, rng, extremes=True):
    """Random bits with finite float16 super-scales; with extremes, row 0 has every bit set (the
    largest quants, sub-scales and mins; Q6_K's most negative sub-scale) and row 1 every bit clear."""
    raw = rng.integers(0, 256, (rows, k // fmt.block, fmt.nbytes), dtype=np.uint8)
    if extremes:
        raw[0], raw[1] = 255, 0
    for f in fmt.fields:
        if f.dtype == "f16":
            scale = (rng.random((rows, k // fmt.block, f.count)) * 0.01 + 1e-3).astype(np.float16)
            raw[:, :, f.offset:f.offset + f.nbytes] = scale.view(np.uint8).reshape(rows, k // fmt.block, -1)
    return raw


def check_bitwise(lib, g, w, rng, threads=THREADS, seqs=(1, 3, 7)):
    k = g.inputs()["x"].shape[1].as_int()
    for seq in seqs:
        for kind in ("normal", "zero_block", "outlier"):
            x = activations(seq, k, rng, kind)
            want = interpreter.run(g, {"seq": seq, "past": 0}, {"x": x}, w)["out0"]
            for t in threads:
                got = lib.run({"seq": seq, "past": 0}, {"x": x}, w, threads=t)["out0"]
                assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (seq, kind, t)


def weights_of(name, k=512, n=64, seed=0):
    fmt = format_named(name)
    raw = random_blocks(fmt, n, k, np.random.default_rng(seed))
    return fmt, raw, split_superblocks(raw, fmt, n, k)


@pytest.mark.parametrize("name", K_FORMATS)
def test_parts_are_the_files_numbers(name):
    """sc * d * qs - mn * dmin per sub-block is ggml's dequantization bit for bit: the products
    of small integers and a float16 are exact, so only the last multiply and subtract round."""
    fmt, raw, parts = weights_of(name)
    assert superblock_form(fmt)
    w = superblock_values(parts, fmt)
    assert np.array_equal(w.view(np.uint32), dequantize(fmt, raw.reshape(-1)).reshape(w.shape).view(np.uint32))


@pytest.mark.parametrize("name", K_FORMATS)
def test_definition_against_exact_arithmetic(name):
    """The interpreter's result, recomputed from int64 sums over each super-block and float32
    steps in the stated order; and within float32 rounding of the exact product of the
    quantized activations (one scale per 256, as ggml's Q8_K) with the dequantized weights."""
    fmt, raw, p = weights_of(name, seed=1)
    g = superblock_graph(fmt, 512, 64)
    x = activations(3, 512, np.random.default_rng(2))
    got = interpreter.run(g, {"seq": 3, "past": 0}, {"x": x}, p)["out0"]
    b = GraphBuilder("q")
    xq, xd = nn.quantize_blocks(b, b.input("x", [SEQ, 512]), fmt.block)
    b.output("xq", xq)
    b.output("xd", xd)
    q = interpreter.run(b.finish(), {"seq": 3, "past": 0}, {"x": x}, {})
    xq, xd = q["xq"].astype(np.int64), q["xd"]
    n_sub, per_super = 512 // fmt.sub, fmt.block // fmt.sub
    xs, ws = xq.reshape(3, n_sub, fmt.sub), p["qs"].astype(np.int64).reshape(64, n_sub, fmt.sub)
    want = np.zeros((3, 64), np.float32)
    for big in range(n_sub // per_super):
        subs = range(big * per_super, (big + 1) * per_super)
        dots = sum((xs[:, s] @ ws[:, s].T) * p["sc"][:, s].astype(np.int64) for s in subs)
        assert np.abs(dots).max() < 2 ** 31
        t = dots.astype(np.float32) * p["d"][:, big].astype(np.float32)
        if fmt.has_min:
            sums = sum(xs[:, s].sum(1, keepdims=True) * p["mn"][:, s].astype(np.int64) for s in subs)
            t = t - sums.astype(np.float32) * p["dmin"][:, big].astype(np.float32)
        want = want + xd[:, big:big + 1] * t
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    values = dequantize(fmt, raw.reshape(-1)).reshape(64, 512).astype(np.float64)
    exact = (xq * np.repeat(xd, fmt.block, axis=1)).astype(np.float64) @ values.T
    assert np.abs(got - exact).max() <= 1e-5 * np.abs(values).sum(1).max() * np.abs(x).max()


@pytest.mark.parametrize("name", K_FORMATS)
def test_scalar_kernels_are_bitwise(name):
    fmt, _, w = weights_of(name, k=256, n=32, seed=3)
    g = superblock_graph(fmt, 256, 32)
    for fuse in (False, True):
        check_bitwise(GraphLibrary(g, fuse=fuse), g, w, np.random.default_rng(4), threads=(1, 3), seqs=(1, 3))


@pytest.mark.parametrize("march", TARGETS)
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_recipe_kernels_are_bitwise_at_every_target(march, name, monkeypatch):
    """The recipe (columns in lanes, dot products of 4, quants packed in 8 bits, sub-scales and
    super-scales packed so the lanes' are adjacent), on two super-blocks and on one."""
    use_target(march, monkeypatch)
    lanes = vector_lanes(march)
    for k in (512, 256):
        fmt, _, w = weights_of(name, k=k, seed=5)
        g = superblock_graph(fmt, k, 64)
        lib = GraphLibrary(g, fuse=True, schedule="default")
        if lanes:
            helper = "nc_dot4u" if dot_weight_offset(march) else "nc_dot4"
            assert f"{helper}_{lanes}(" in lib.source, f"the recipe used no {helper}"
        check_bitwise(lib, g, w, np.random.default_rng(6))


def narrow_schedule(k, fmt, columns, rows, lanes=16, dot_offset=128):
    """The recipe with the quants in the format's fewest bits (as a GGUF's K-format blocks are
    scheduled in a native library)."""
    col, row, supers, subs, products = _superblock_column_loop(k)
    weights = frozenset(p.name for p in k.params if p.access == "read" and p.name != "p1")
    quants, scales = _superblock_operands(k, supers, subs, products, weights)
    narrow = {quants[0]: narrow_storage(fmt)}
    return tuple(superblock_projection(col, row, supers, subs, products, lanes, quants, scales, dot_offset, columns,
                                       rows, narrow))


# 4-bit quants without an offset: a sub-block's dot products summed in int16 pairs at 8 lanes
PAIRED = {"Q4_K", "Q2_K", "Q4_1"}


@pytest.mark.parametrize("name", K_FORMATS)
@pytest.mark.parametrize("columns, rows", [(1, 0), (2, 3)])
@pytest.mark.parametrize("march", ["x86-64-v4+vnni", "x86-64-v3+vnni", "x86-64-v3"])
def test_narrow_kernels_are_bitwise(march, name, columns, rows, monkeypatch):
    """Q4_K, Q3_K and Q2_K in 4 bits, Q5_K in 5, Q6_K in 6: nc_dot4u<bits> rebuilds each byte;
    the sum of the activations corrects an offset (Q6_K's 32, Q3_K's 4) once per sub-block, and
    is what the sub-mins multiply: both read the sums nn.linear_k computes once per row, none is
    added up again per column block (no nc_sum_i8). At 8 lanes the 4-bit quants without an offset are summed in
    int16 pairs (schedule/pairs.py) and multiplied by their sub-scales by vpmaddwd; row tiles read
    the bytes unpacked once per column block."""
    use_target(march, monkeypatch)
    lanes = vector_lanes(march)
    fmt, _, w = weights_of(name, seed=7)
    g = superblock_graph(fmt, 512, 64)
    bits, offset = narrow_storage(fmt)
    lib = GraphLibrary(g, fuse=True, schedule=lambda k: narrow_schedule(k, fmt, columns, rows, lanes,
                                                                        dot_weight_offset(march))
                       if _superblock_column_loop(k) else ())
    paired = lanes == 8 and name in PAIRED
    calls = [narrow_dot_call(bits, lanes, pairs=paired, half_known=known) in lib.source for known in (True, False)]
    if fmt.block > fmt.sub:  # at 8 lanes a literal half (super-blocks of 256)
        assert calls[0] and (not calls[1] or lanes == 16)
    else:  # Q4_1, Q5_1: blocks of 32, whose halves the C finds from the index at 8 lanes
        assert any(calls)
    assert ("nc_pairs_mul_8(" in lib.source) == paired and ("nc_dot4usp_8(" in lib.source) == (paired and rows > 0)
    assert "nc_sum_i8(" not in lib.source
    check_bitwise(lib, g, w, np.random.default_rng(8))


def test_sums_operand_must_be_the_activations_sums():
    """A matmul's xs operand stands for sums a kernel would add up itself: the interpreter
    refuses a graph whose xs is anything else, for block_matmul and superblock_matmul alike."""
    fmt, _, w = weights_of("Q6_K", seed=3)
    b = GraphBuilder("sums")
    x, other = b.input("x", [SEQ, 512]), b.input("other", [SEQ, 512])
    xq, xd = nn.quantize_blocks(b, x, fmt.block)
    wrong = nn.sub_block_sums(b, nn.quantize_blocks(b, other, fmt.block)[0], 512 // fmt.sub)
    parts = [b.weight(p, list(w[p].shape), DTYPES[p]) for p in superblock_parts(fmt)]
    b.output("y", b.superblock_matmul(xq, xd, *parts, xs=wrong))
    xq8, xd8 = nn.quantize_blocks(b, x)
    b.output("z", b.block_matmul(xq8, xd8, b.weight("q8", [8, 512], "i8"), b.weight("d8", [8, 16], "f16"),
                                 nn.sub_block_sums(b, nn.quantize_blocks(b, other)[0], 16)))
    g = b.finish()
    rng = np.random.default_rng(4)
    weights = dict(w, q8=rng.integers(-127, 128, (8, 512)).astype(np.int8), d8=np.ones((8, 16), np.float16))
    feeds = {"x": activations(2, 512, rng), "other": activations(2, 512, rng)}
    with pytest.raises(interpreter.InterpreterError, match="superblock_matmul: its sums operand"):
        interpreter.run(g, {"seq": 2, "past": 0}, feeds, weights)
    feeds["other"] = feeds["x"]
    interpreter.run(g, {"seq": 2, "past": 0}, feeds, weights)  # the true sums: accepted


def test_pair_sums_refuse_what_could_leave_int16():
    """Eight dot products of 4 on 4-bit bytes stay within int16 (8 * 2 * 15 * 128 = 30720), eight
    on 5-bit ones or four on 6-bit ones may not: PairSums finds no sum to keep in pairs there."""
    from nanocompile.schedule import Pack, PairSums, ScheduleError, apply
    from nanocompile.schedule.pairs import pairs_fit

    assert pairs_fit(8, 4) and not pairs_fit(9, 4) and pairs_fit(4, 5) and not pairs_fit(8, 5)
    assert not pairs_fit(4, 6) and pairs_fit(2, 6) and not pairs_fit(1, 8)
    for name in ("Q4_K", "Q5_K", "Q6_K"):
        fmt, _, _ = weights_of(name, seed=7)
        k = next(k for k in graph_kernels(superblock_graph(fmt, 512, 64)).values() if _superblock_column_loop(k))
        schedule = narrow_schedule(k, fmt, 1, 0, 8, 0)
        quants = next(d.param for d in schedule if isinstance(d, Pack) and d.bits < 8)
        assert any(isinstance(d, PairSums) for d in schedule) == (name == "Q4_K")
        plain = tuple(d for d in schedule if not isinstance(d, PairSums))
        if name == "Q4_K":
            apply(k, plain + (PairSums(quants),))
        with pytest.raises(ScheduleError, match="fits int16 pairs"):
            apply(k, plain + (PairSums(quants if name != "Q4_K" else "p9"),))


def test_operands_are_checked():
    b = GraphBuilder("bad")
    x = b.input("x", [SEQ, 256])
    xq, xd = nn.quantize_blocks(b, x, 32)
    q256 = nn.quantize_blocks(b, x, 256)
    qs, sc = b.weight("qs", [8, 256], "i8"), b.weight("sc", [8, 8], "i8")
    d, mn = b.weight("d", [8, 1], "f16"), b.weight("mn", [8, 8], "i8")
    with pytest.raises(IRError, match="wants i8, f32, i8, i8, f16, f32 operands"):  # a sixth is the sums
        b.superblock_matmul(*q256, qs, sc, d, mn)
    with pytest.raises(IRError, match="wants i8, f32, i8, i8, f16"):
        b.superblock_matmul(*q256, qs, d, d)
    with pytest.raises(IRError, match="sub-mins"):
        b.superblock_matmul(*q256, qs, sc, d, b.weight("mn2", [8, 4], "i8"), d)
    b.superblock_matmul(*q256, qs, sc, d, mn, d)  # Q4_K's shapes
    b.superblock_matmul(*q256, qs, sc, d, mn, d, nn.sub_block_sums(b, q256[0], 8))  # and the activations' sums
    b.superblock_matmul(*q256, qs, sc, d, xs=nn.sub_block_sums(b, q256[0], 8))  # sums without mins (Q6_K)
    with pytest.raises(IRError, match="activation sums"):
        b.superblock_matmul(*q256, qs, sc, d, mn, d, nn.sub_block_sums(b, q256[0], 4))
    with pytest.raises(IRError, match="activation sums"):
        b.block_matmul(xq, xd, b.weight("q8", [8, 256], "i8"), b.weight("d8", [8, 8], "f16"),
                       nn.sub_block_sums(b, xq, 4))
    with pytest.raises(IRError, match="wants i8, f32, i8, i8, f16, i8, f16, f32"):
        b.superblock_matmul(*q256, qs, sc, d, mn, d, qs)
    with pytest.raises(IRError, match="activation scales"):
        b.superblock_matmul(xq, xd, qs, sc, d)  # activations in blocks of 32, not one scale per 256
    wide = b.input("wide", [SEQ, 512])
    xq512, xd512 = nn.quantize_blocks(b, wide, 512)
    with pytest.raises(IRError, match="exceed 256"):
        b.superblock_matmul(xq512, xd512, b.weight("qs2", [8, 512], "i8"), b.weight("sc2", [8, 16], "i8"),
                            b.weight("d2", [8, 1], "f16"))


@pytest.mark.parametrize("name", ["Q2_K", "Q4_K", "Q5_K"])
@pytest.mark.parametrize("columns, rows", [(1, 0), (1, 6), (2, 3)])
@pytest.mark.parametrize("march, lanes", [("x86-64-v4+vnni", 16), ("x86-64-v4", 16), ("x86-64-v3+vnni", 8),
                                          ("x86-64-v3", 8)])
def test_mins_in_int16_pairs_are_bitwise(march, lanes, name, columns, rows, monkeypatch):
    """MinPairs: the mins term two sub-blocks at a time in each lane's int16 halves (vpdpwssd; without
    VNNI vpmaddwd and an add), in a loop after the sub-block loop, at 16 and 8 lanes: bitwise the
    interpreter at 1, 3 and 7 rows, with a row of every bit set (the largest mins) and activations
    at the int8 limits."""
    from nanocompile.schedule import MinPairs

    use_target(march, monkeypatch)
    fmt, _, w = weights_of(name, seed=9)
    g = superblock_graph(fmt, 512, 64)

    def schedule(k):
        found = _superblock_column_loop(k)
        if not found:
            return ()
        return narrow_schedule(k, fmt, columns, rows, lanes, dot_weight_offset(march)) + (MinPairs(found[3].var),)

    lib = GraphLibrary(g, fuse=True, schedule=schedule)
    assert f"nc_dot2w_{lanes}(" in lib.source
    check_bitwise(lib, g, w, np.random.default_rng(10))


def test_min_pairs_only_where_a_mins_term_fits_int16(monkeypatch):
    """The recipe pairs the mins at 16 lanes for a format with mins (Q4_K), not for one without
    (Q6_K), nor at 8 lanes (measured slower there: recipes.MINPAIR_LANES); the directive refuses a
    kernel with no mins term to pair; where AMX tile sums apply they take the mins themselves, and
    the schedule is the one without MinPairs."""
    from nanocompile.schedule import MinPairs, ScheduleError, apply

    for march, lanes, name, paired in (("x86-64-v4+vnni", 16, "Q4_K", True), ("x86-64-v4+vnni", 16, "Q6_K", False),
                                       ("x86-64-v3", 8, "Q4_K", False)):
        use_target(march, monkeypatch)
        fmt, _, _ = weights_of(name, seed=9)
        lib = GraphLibrary(superblock_graph(fmt, 512, 64), fuse=True, schedule="default")
        assert ("MinPairs(" in lib.source) == paired, (march, name)
        assert (f"nc_dot2w_{lanes}(" in lib.source) == paired, (march, name)
    fmt, _, _ = weights_of("Q6_K", seed=9)
    k = next(k for k in graph_kernels(superblock_graph(fmt, 512, 64)).values() if _superblock_column_loop(k))
    subs = _superblock_column_loop(k)[3]
    with pytest.raises(ScheduleError, match="sums no mins term"):
        apply(k, narrow_schedule(k, fmt, 1, 0, 16, 128) + (MinPairs(subs.var),))
    from nanocompile.schedule import AmxSums
    from nanocompile.schedule.program import with_tile_sums

    fmt, _, _ = weights_of("Q4_K", seed=9)
    k = next(k for k in graph_kernels(superblock_graph(fmt, 512, 64)).values() if _superblock_column_loop(k))
    plain = narrow_schedule(k, fmt, 1, 6, 16, 0)
    tiled = with_tile_sums(k, plain + (MinPairs(_superblock_column_loop(k)[3].var),))
    assert any(isinstance(d, AmxSums) for d in tiled) and not any(isinstance(d, MinPairs) for d in tiled)
    assert tiled == with_tile_sums(k, plain)
