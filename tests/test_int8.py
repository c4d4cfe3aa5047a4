"""int8 (phase 6): block quantization and block_matmul, bitwise against the interpreter.

Integer sums are exact in any order, and the float32 part (float(isum) * (xd * wd), summed over
blocks in order) is done by the same operations in the same order by the interpreter, the
scalar kernel and every vector schedule; so every comparison here is bitwise, at every target
this CPU runs (AVX-512 VNNI, AVX-512 without VNNI, AVX-VNNI, AVX2, scalar), at 1, 2, 3 and 8
threads, with guard regions around every output, on widths that leave every tail.
"""
import subprocess

import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config
from helpers import (TARGETS, THREADS, activations, check_bitwise, graph_kernels, greedy_run, make_graph, projection_graph,
                     use_target)

from nanocompile.codegen.options import DEFAULT_CHUNK
from nanocompile.compiler.graph_library import GraphLibrary
from nanocompile.engine.compiled import CompiledSession
from nanocompile.engine.interpreted import InterpreterSession
from nanocompile.ir import interpreter
from nanocompile.loopir.ir import format_kernel
from nanocompile.models.quantize import quantize_q8_0, split_q8_0
from nanocompile.schedule import DotProduct, LaneReduce, Pack, Parallel, ScheduleError, UnrollJam, Vectorize, apply
from nanocompile.schedule.blocking import pack_array
from nanocompile.target import dot_weight_offset, runnable_targets, vector_lanes

pytestmark = pytest.mark.c

def weights(k, n, seed=0):
    qs, d = quantize_q8_0(np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32))
    return {"wq": qs, "wd": d}


@pytest.mark.parametrize("k, n", [(64, 32), (70, 48), (45, 16)])  # 70 and 45: a shorter last block
def test_quantize_and_block_matmul_scalar_kernels_are_bitwise(k, n):
    g = projection_graph(k, n)
    w = weights(k, n)
    for fuse in (False, True):
        check_bitwise(GraphLibrary(g, fuse=fuse), g, w, np.random.default_rng(1), threads=(1, 3))


def test_quantized_activations_follow_the_definition():
    """Per block of 32: amax = max |x|, xd = amax / 127, xq = rint(x * (127 / amax)), half to
    even; the zero padding of a shorter last block quantizes to 0."""
    g = projection_graph(70, 16)
    x = activations(3, 70, np.random.default_rng(2), "zero_block")
    out = interpreter.run(g, {"seq": 3, "past": 0}, {"x": x}, weights(70, 16))
    xq, xd = out["out1"], out["out2"]
    padded = np.zeros((3, 96), np.float32)
    padded[:, :70] = x
    blocks = padded.reshape(3, 3, 32)
    amax = np.abs(blocks).max(2)
    assert np.array_equal(xd, amax / np.float32(127))
    inverse = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    assert np.array_equal(xq.reshape(3, 3, 32), np.rint(blocks * inverse[:, :, None]).astype(np.int8))
    assert (xq[:, 70:] == 0).all() and (xq[:, :32] == 0).all()


@pytest.mark.parametrize("march", TARGETS)
def test_vector_dot_kernels_are_bitwise_at_every_target(march, monkeypatch):
    """The int8 recipe's kernel (vector lanes over columns, dot products of 4, packed weights)
    and a hand-made schedule with one column vector, at each target's lanes."""
    use_target(march, monkeypatch)
    lanes = vector_lanes(march)
    g = projection_graph(70, 64)
    w = weights(70, 64, seed=3)
    recipe = GraphLibrary(g, fuse=True, schedule="default")
    if lanes:  # unsigned weights (offset 128) where vpdpbusd takes them, else the sign moved per vector
        helper = "nc_dot4u" if dot_weight_offset(march) else "nc_dot4"
        assert f"{helper}_{lanes}(" in recipe.source, f"the recipe used no {helper}"
    check_bitwise(recipe, g, w, np.random.default_rng(4))
    if lanes:  # both storages at every target: without VNNI, nc_dot4u's exact lane loop
        for offset in (0, 128):
            one = (Vectorize("i1", lanes), DotProduct("j", 4), Pack("p2", 96, lanes, 4, offset), Pack("p4", 3, lanes),
                   Parallel("i1"))
            lib = GraphLibrary(g, fuse=True, schedule=lambda k: one if k.op == "block_matmul" else ())
            check_bitwise(lib, g, w, np.random.default_rng(5), threads=(1, 2))


@pytest.mark.parametrize("march", TARGETS)
def test_quantization_kernels_on_vector_lanes(march, monkeypatch):
    """Whole blocks (no padding select): each block's absolute maximum is a lane reduction
    (LaneReduce), and the quants are converted and stored 8 or 16 at a time (vcvttps2dq, then
    vpmovdb or two saturating packs); bitwise as the scalar code, and a NaN in a block propagates
    to its scale (which NaN is not part of reduce_max's definition)."""
    use_target(march, monkeypatch)
    lanes = vector_lanes(march)
    g = projection_graph(64, 32)
    lib = GraphLibrary(g, fuse=True, schedule="default")
    if lanes:
        assert f"nc_store_i8_{lanes}(" in lib.source and f"nc_lane_max{lanes}(" in lib.source
    w = weights(64, 32, seed=10)
    check_bitwise(lib, g, w, np.random.default_rng(11))
    x = activations(3, 64, np.random.default_rng(12))
    x[1, 40] = np.nan
    env = {"seq": 3, "past": 0}
    want = interpreter.run(g, env, {"x": x}, w)
    got = lib.run(env, {"x": x}, w, threads=2)
    assert np.isnan(got["out2"][1, 1]) and np.isnan(want["out2"][1, 1])
    finite = ~np.isnan(want["out2"])
    assert np.array_equal(got["out2"][finite], want["out2"][finite])


@pytest.mark.parametrize("march", TARGETS)
def test_block_maxima_read_through_a_heads_layout_run_on_lanes(march, monkeypatch):
    """Attention's output [heads, seq, 64] quantized by rows in blocks of 32: a block's elements
    lie at (i * 32 + r) / 64 and % 64 of its head's rows, consecutive for 16 (or 8) lanes since
    32 and the lanes divide 64. LaneReduce sees it; bitwise, NaN propagating."""
    from nanocompile.frontend import nn
    from nanocompile.ir import SEQ

    use_target(march, monkeypatch)
    lanes = vector_lanes(march)

    def build(b):
        heads = b.input("x", [3, SEQ, 64])
        rows = b.reshape(b.permute(heads, [1, 0, 2]), [SEQ, 192])
        return list(nn.quantize_blocks(b, rows))

    g = make_graph("heads_amax", build)
    lib = GraphLibrary(g, fuse=True, schedule="default")
    if lanes:
        assert f"LaneReduce(r, {lanes})" in lib.source and f"nc_lane_max{lanes}(" in lib.source
    rng = np.random.default_rng(21)
    for seq in (1, 5, 16):
        x = (rng.standard_normal((3, seq, 64)) * 3).astype(np.float32)
        x[1, 0, 7] = np.nan if seq > 1 else 1e4
        env = {"seq": seq, "past": 0}
        want = interpreter.run(g, env, {"x": x}, {})
        for t in THREADS:
            got = lib.run(env, {"x": x}, {}, threads=t)
            for key in want:
                same = np.isnan(want[key]) & np.isnan(got[key]) if want[key].dtype == np.float32 else False
                assert np.array_equal(np.where(same, 0, got[key]), np.where(same, 0, want[key])), (key, seq, t)


def test_lane_reduce_is_for_max_reductions_only():
    g = projection_graph(64, 32)
    kernels = graph_kernels(g)
    amax = next(k for k in kernels.values() if "reduce_max" in k.name or k.op == "reduce_max")
    text = format_kernel(apply(amax, (LaneReduce("r", 16),)))
    assert "vector(16) reduce r in 0..2:" in text and "lane_max16(" in text
    k = next(k for k in kernels.values() if k.op == "block_matmul")
    with pytest.raises(ScheduleError, match="one max update"):
        apply(k, (LaneReduce("j", 16),))  # a sum: its order is its value
    with pytest.raises(ScheduleError, match="output loop"):
        apply(amax, (LaneReduce("i0", 16),))


@pytest.mark.parametrize("march", TARGETS)
@pytest.mark.parametrize("k,blocks", [(256, 16), (256, 8), (512, 2)])  # runs of 16 (Q6_K), 32 (Q4_K), 256
def test_activation_block_sums_are_integer_byte_sums(march, k, blocks, monkeypatch):
    """The quantized activations' block sums (a K-format projection's xs operand) are float32
    sums of int8 values: the recipe takes each as one integer sum (ByteSums, nc_sum_i8), bitwise
    the float loop it replaces, blocks of all -127 or +127 included."""
    from nanocompile.frontend import nn
    from nanocompile.ir import SEQ

    use_target(march, monkeypatch)
    g = make_graph(f"sums_{k}_{blocks}", lambda b: nn.sub_block_sums(b, b.input("x", [SEQ, k], "i8"), blocks))
    lib = GraphLibrary(g, fuse=True, schedule="default")
    assert "nc_sum_i8(" in lib.source and "ByteSums(" in lib.source
    rng = np.random.default_rng(k + blocks)
    for seq in (1, 3, 16):
        x = rng.integers(-127, 128, (seq, k), dtype=np.int8)
        x[0], x[-1] = 127, -127
        env = {"seq": seq, "past": 0}
        want = interpreter.run(g, env, {"x": x}, {})
        for t in THREADS:
            got = lib.run(env, {"x": x}, {}, threads=t)
            assert np.array_equal(got["out0"].view(np.uint8), want["out0"].view(np.uint8)), (seq, t)
        assert np.array_equal(want["out0"], x.reshape(seq, blocks, -1).sum(-1, dtype=np.int64))  # exact sums


def test_the_tuners_points_for_block_sums_start_with_byte_sums():
    """Every point the tuner measures for a block-sum kernel sums its bytes first, as the recipe
    does, and vectorized points of other kernels keep their one Vectorize."""
    from nanocompile.frontend import nn
    from nanocompile.ir import SEQ
    from nanocompile.schedule import ByteSums, default_schedule
    from nanocompile.schedule.recipes import search_space

    g = make_graph("sums_space", lambda b: nn.sub_block_sums(b, b.input("x", [SEQ, 256], "i8"), 8))
    k = next(iter(graph_kernels(g).values()))
    points = [s for _, s in search_space(k, 16)]
    assert points and all(s[0] == ByteSums("r") and s.count(ByteSums("r")) == 1 for s in points)
    assert default_schedule(k, 16) in points
    g = make_graph("rows_space", lambda b: list(nn.quantize_blocks(b, b.input("x", [SEQ, 64]))))
    vectorized = [s for k in graph_kernels(g).values() for _, s in search_space(k, 16) if Vectorize("i1", 16) in s]
    assert vectorized and all(s.count(Vectorize("i1", 16)) == 1 for s in vectorized)


def test_byte_sums_take_int8_sums_only():
    from nanocompile.schedule import ByteSums

    g = projection_graph(64, 32)
    k = next(k for k in graph_kernels(g).values() if k.op == "block_matmul")
    with pytest.raises(ScheduleError, match="int8 values as float32|one sum update"):
        apply(k, (ByteSums("j"),))  # int32 products of a dot: not a float sum of bytes
    amax = next(k for k in graph_kernels(g).values() if "reduce_max" in k.name)
    with pytest.raises(ScheduleError, match="one sum update"):
        apply(amax, (ByteSums("r"),))
    with pytest.raises(ScheduleError, match="no loop"):
        apply(amax, (ByteSums("nowhere"),))


def test_unsigned_weights_read_outside_dot_products_are_corrected():
    """A weight stored + 128 and read by scalar code (no dot products: the plain products, as a
    gather would read it) subtracts the offset at each read: bitwise as before."""
    g = projection_graph(70, 48)
    w = weights(70, 48, seed=6)
    plain = (Pack("p2", 96, 16, 4, 128), Parallel("i1"))
    lib = GraphLibrary(g, fuse=True, schedule=lambda k: plain if k.op == "block_matmul" else ())
    assert "(uint8_t)" in lib.source
    check_bitwise(lib, g, w, np.random.default_rng(7), threads=(1, 3))


def test_unsigned_weights_start_each_block_from_the_activation_sum():
    """The correction -offset * sum(x) is one start per block and row, shared by the tile's
    column vectors; lanes reading the stored bytes outside a dot product are refused."""
    g = projection_graph(64, 64)
    k = next(k for k in graph_kernels(g).values() if k.op == "block_matmul")
    s = (Vectorize("i1", 16), DotProduct("j", 4), UnrollJam("i1", 2), Pack("p2", 64, 32, 4, 128), Pack("p4", 2, 32),
         Parallel("i1"))
    text = format_kernel(apply(k, s))
    assert text.count("start_isum_0: i32 = (-128 * sum32(p1[((i0 * 64) + (b * 32))]))") == 1
    assert "isum_1: i32 = start_isum_0" in text and "unsigned p2 - 128" in text
    assert "sum4" not in text  # no correction left at the dot products
    with pytest.raises(ScheduleError, match="outside a dot product"):
        apply(k, (Vectorize("i1", 16), Pack("p2", 64, 16, 1, 128)))


def test_pack_array_offset_stores_unsigned_bytes():
    w = np.array([[-127, 0, 5, 127]] * 2, np.int8)
    packed = pack_array(w, 4, 2, 4, 128)
    assert packed.dtype == np.uint8 and packed.tolist() == [[1, 128, 133, 255]] * 2
    with pytest.raises(ValueError, match="leave an unsigned byte"):
        pack_array(np.array([[-127, 0, 5, 127]] * 2, np.int8), 4, 2, 4, 16)


@pytest.mark.parametrize("march", TARGETS)
def test_extreme_blocks_do_not_saturate(march, monkeypatch):
    """Blocks of all +127 and all -127 against weights of all +127 and -127: every pair sum of
    vpmaddubsw is 2 * 127 * 127 = 32258 < 32767, and each block's sum 32 * 127^2 is exact."""
    use_target(march, monkeypatch)
    g = projection_graph(64, 32)
    lib = GraphLibrary(g, fuse=True, schedule="default")
    wq = np.full((32, 64), 127, np.int8)
    wq[16:] = -127
    w = {"wq": wq, "wd": np.ones((32, 2), np.float16)}
    x = np.full((2, 64), 5.0, np.float32)
    x[1] = -5.0  # quantizes to all -127
    env = {"seq": 2, "past": 0}
    want = interpreter.run(g, env, {"x": x}, w)
    assert set(np.unique(want["out1"])) == {127, -127}
    got = lib.run(env, {"x": x}, w, threads=2)
    assert np.array_equal(got["out0"], want["out0"])
    assert abs(want["out0"][0, 0]) == np.float32(64 * 127 * 127) * np.float32(5.0 / 127)


def test_dot_product_directive_rewrites_the_block_loop():
    g = projection_graph(64, 16)
    k = next(k for k in graph_kernels(g).values() if k.op == "block_matmul")
    assert "reduce j in 0..32:" in format_kernel(k)
    text = format_kernel(apply(k, (DotProduct("j", 4),)))
    assert "reduce j in 0..8:" in text
    assert "isum = dot4(isum, p1[((i0 * 64) + ((b * 32) + (j * 4)))], p2[((i1 * 64) + ((b * 32) + (j * 4)))])" in text


def test_vnni_targets_emit_vpdpbusd(tmp_path, monkeypatch):
    """The kernels are generated; the target decides the instruction: vpdpbusd with VNNI,
    vpmaddubsw + vpmaddwd without."""
    seen = {}
    for march in ("x86-64-v4+vnni", "x86-64-v3"):
        monkeypatch.setenv("NANOCOMPILE_MARCH", march)
        if march not in runnable_targets():
            continue
        lib = GraphLibrary(projection_graph(64, 64), fuse=True, schedule="default", directory=tmp_path)
        disassembly = subprocess.run(["objdump", "-d", str(lib.path)], capture_output=True, text=True).stdout
        seen[march] = ("vpdpbusd" in disassembly, "vpmaddubsw" in disassembly)
    if "x86-64-v4+vnni" in seen:
        assert seen["x86-64-v4+vnni"][0]
    if "x86-64-v3" in seen:
        assert seen["x86-64-v3"] == (False, True)


# the model ------------------------------------------------------------------------------------

INT8_CONFIGS = {
    "whole-blocks-tied": dict(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, layers=2, vocab=256, tied=True),
    "odd-widths": dict(hidden=45, heads=3, kv_heads=1, head_dim=14, ffn=97, layers=2, vocab=211),
    "gqa7": dict(hidden=70, heads=7, kv_heads=1, head_dim=10, ffn=131, layers=2, vocab=301),
}


@pytest.mark.parametrize("name", sorted(INT8_CONFIGS))
def test_int8_model_scheduled_is_bitwise_unscheduled_at_every_target(name):
    """Every target this CPU runs for the odd widths (every tail of the blocks, the lanes and the
    row tiles); this CPU's own for the others. Each against the unscheduled library of its target."""
    cfg = tiny_config(**INT8_CONFIGS[name])
    targets = runnable_targets() if name == "odd-widths" else runnable_targets()[:1]
    w = random_weights(cfg, seed=4)
    ids = [int(t) for t in np.random.default_rng(6).integers(0, cfg.vocab_size, DEFAULT_CHUNK + 6)]  # two chunks
    for march in targets:
        # the baseline at the same target: one without FMA splits the float32 matmul sums (separate)
        base = CompiledSession.from_weights(cfg, w, n_ctx=128, precision="int8", schedule=False, march=march)
        want = [base.step(ids, all_logits=True)] + [base.step([t]) for t in (5, 6, 7)]
        for threads in THREADS:
            s = CompiledSession.from_weights(cfg, w, n_ctx=128, precision="int8", threads=threads, march=march)
            got = [s.step(ids, all_logits=True)] + [s.step([t]) for t in (5, 6, 7)]
            assert all(np.array_equal(a, b) for a, b in zip(want, got)), (march, threads)
            for layer in range(cfg.num_hidden_layers):
                for a, b in zip(s.read_cache(layer), base.read_cache(layer)):
                    assert np.array_equal(a, b)
            s.close()


@pytest.mark.parametrize("name", sorted(INT8_CONFIGS))
def test_int8_model_agrees_with_the_int8_interpreter(name):
    """The interpreter's float32 parts (attention) sum in BLAS's order, so logits agree within
    float32 rounding, not bitwise; greedy tokens are identical."""
    cfg = tiny_config(**INT8_CONFIGS[name])
    w = random_weights(cfg, seed=4)
    prompt = [3, 14, 15, 92, 65, 35, 89, 79, 32]
    compiled = greedy_run(CompiledSession.from_weights(cfg, w, n_ctx=64, precision="int8", threads=2), prompt, 16)
    interp = greedy_run(InterpreterSession.from_weights(cfg, w, n_ctx=64, precision="int8"), prompt, 16)
    assert compiled["tokens"] == interp["tokens"]
    assert np.abs(compiled["prompt_logits"] - interp["prompt_logits"]).max() <= 1e-4


def test_int8_unfused_scheduled_model_is_bitwise_unscheduled():
    """Schedules without fusion: the activation quantizer's rint kernel on its own in vector
    lanes (nc_rintf, vrndscaleps) gives the same library results as the unscheduled build."""
    cfg = tiny_config(**INT8_CONFIGS["odd-widths"])
    w = random_weights(cfg, seed=4)
    ids = [3, 14, 15, 92, 65, 35, 89]
    base = CompiledSession.from_weights(cfg, w, n_ctx=32, precision="int8", fuse=False, schedule=False)
    scheduled = CompiledSession.from_weights(cfg, w, n_ctx=32, precision="int8", fuse=False, threads=2)
    assert any(k.startswith("rint") and k_.schedule for k, k_ in scheduled.module.kernels.items())
    for s in (base, scheduled):
        s.want = [s.step(ids, all_logits=True)] + [s.step([t]) for t in (5, 6)]
    assert all(np.array_equal(a, b) for a, b in zip(base.want, scheduled.want))


def test_q8_0_tensors_split_as_stored():
    """A GGUF Q8_0 tensor's blocks (a float16 scale, 32 int8 values) split into the kernels'
    arrays without a float32 round trip: the same bytes."""
    import gguf
    w = np.random.default_rng(7).standard_normal((8, 64)).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    qs, d = split_q8_0(raw, 8, 64)
    blocks = raw.reshape(8, 2, 34)
    assert np.array_equal(qs.view(np.uint8).reshape(8, 2, 32), blocks[:, :, 2:])
    assert np.array_equal(d.view(np.uint8).reshape(8, 2, 2), blocks[:, :, :2])
    q2, d2 = quantize_q8_0(w)
    assert np.array_equal(q2, qs) and np.array_equal(d2, d)
