"""Each schedule directive as a rewrite of the loop IR: what it does (the loop IR before and after,
as text), each refusal (one test each), and the recipes' choices. No C is compiled here; the
bitwise runs of these schedules are in test_schedules.py."""
import pytest
from bench.support.tiny import tiny_config
from helpers import graph_kernels, make_graph, target_lanes, target_level, write_k_gguf

from nanocompile.codegen.render import render_tree
from nanocompile.compiler.driver import compile_model
from nanocompile.ir import SEQ
from nanocompile.loopir.affine import linear
from nanocompile.loopir.ir import (REDUCTION, Acc, AccInit, AccUpdate, Bin, FConst, IConst, Kernel, Load, Loop, Param,
                                   Prefetch, Select, Store, Var, format_kernel)
from nanocompile.loopir.traverse import statements_in_loops
from nanocompile.schedule import (FetchNextBlock, Pack, Parallel, PrefetchNext, Reorder, ScheduleError, Split, Unroll, UnrollJam,
                                  Vectorize, apply)


def matmul_kernel():
    """x[seq, 6] @ W[16, 6]^T, fused, unscheduled."""
    g = make_graph("mm", lambda b: b.matmul(b.input("x", [SEQ, 6]), b.permute(b.weight("w", [16, 6]), [1, 0])))
    return next(iter(graph_kernels(g).values()))


def body(k) -> str:
    """The kernel's loop IR below its name and schedule lines."""
    return "\n".join(line for line in format_kernel(k).splitlines()[1:] if not line.startswith("  schedule:"))


LOWERED = """\
  for i0 in 0..seq:
    for i1 in 0..16:
      acc: f32 = 0.0
      reduce k in 0..6:
        acc = fma(p1[((i0 * 6) + k)], p2[(k + (i1 * 6))], acc)
      p0[((i0 * 16) + i1)] = acc"""

STRUCTURE = {
    "split": ((Split("i0", 4),), """\
  for i0o in 0..(seq / 4):
    for i0i in 0..4:
      for i1 in 0..16:
        acc: f32 = 0.0
        reduce k in 0..6:
          acc = fma(p1[((((i0o * 4) + i0i) * 6) + k)], p2[(k + (i1 * 6))], acc)
        p0[((((i0o * 4) + i0i) * 16) + i1)] = acc
  for i0t in 0..(seq % 4):
    for i1 in 0..16:
      acc: f32 = 0.0
      reduce k in 0..6:
        acc = fma(p1[(((((seq / 4) * 4) + i0t) * 6) + k)], p2[(k + (i1 * 6))], acc)
      p0[(((((seq / 4) * 4) + i0t) * 16) + i1)] = acc"""),
    "reorder": ((Reorder("i0", "i1"),), """\
  for i1 in 0..16:
    for i0 in 0..seq:
      acc: f32 = 0.0
      reduce k in 0..6:
        acc = fma(p1[((i0 * 6) + k)], p2[(k + (i1 * 6))], acc)
      p0[((i0 * 16) + i1)] = acc"""),
    "unroll": ((Unroll("i1", 2),), """\
  for i0 in 0..seq:
    for i1 in 0..8 x2:
      acc_0: f32 = 0.0
      reduce k in 0..6:
        acc_0 = fma(p1[((i0 * 6) + k)], p2[(k + ((i1 * 2) * 6))], acc_0)
      p0[((i0 * 16) + (i1 * 2))] = acc_0
      acc_1: f32 = 0.0
      reduce k in 0..6:
        acc_1 = fma(p1[((i0 * 6) + k)], p2[(k + (((i1 * 2) + 1) * 6))], acc_1)
      p0[((i0 * 16) + ((i1 * 2) + 1))] = acc_1"""),
    "unroll_jam": ((UnrollJam("i1", 2),), """\
  for i0 in 0..seq:
    for i1 in 0..8 x2:
      acc_0: f32 = 0.0
      acc_1: f32 = 0.0
      reduce k in 0..6:
        acc_0 = fma(p1[((i0 * 6) + k)], p2[(k + ((i1 * 2) * 6))], acc_0)
        acc_1 = fma(p1[((i0 * 6) + k)], p2[(k + (((i1 * 2) + 1) * 6))], acc_1)
      p0[((i0 * 16) + (i1 * 2))] = acc_0
      p0[((i0 * 16) + ((i1 * 2) + 1))] = acc_1"""),
    "vectorize_pack": ((Vectorize("i1", 8), Pack("p2", 6, 8)), """\
  for i0 in 0..seq:
    vector(8) for i1 in 0..2:
      acc: f32 = 0.0
      reduce k in 0..6:
        acc = fma(p1[((i0 * 6) + k)], p2[(((i1 * 48) + (k * 8)) + lane)], acc)
      p0[((i0 * 16) + ((i1 * 8) + lane))] = acc"""),
    "prefetch_next": ((Vectorize("i1", 8), Pack("p2", 6, 8), Reorder("i0", "i1"), PrefetchNext("i1", "i0")), """\
  vector(8) for i1 in 0..2:
    for i0 in 0..seq:
      acc: f32 = 0.0
      reduce k in 0..6:
        prefetch p2[(((i1 * 48) + (k * 8)) + 48)]
        acc = fma(p1[((i0 * 6) + k)], p2[(((i1 * 48) + (k * 8)) + lane)], acc)
      p0[((i0 * 16) + ((i1 * 8) + lane))] = acc"""),
    "parallel": ((Parallel("i1"),), """\
  for i0 in 0..seq:
    parallel for i1 in 0..16:
      acc: f32 = 0.0
      reduce k in 0..6:
        acc = fma(p1[((i0 * 6) + k)], p2[(k + (i1 * 6))], acc)
      p0[((i0 * 16) + i1)] = acc"""),
}


def test_lowering_types_its_loops():
    k = matmul_kernel()
    assert body(k) == LOWERED
    assert [(lp.var, lp.role) for lp in (k.body[0], k.body[0].body[0], k.body[0].body[0].body[1])] == \
        [("i0", "output"), ("i1", "output"), ("k", "reduction")]


@pytest.mark.parametrize("name", sorted(STRUCTURE))
def test_directive_rewrites_the_loop_ir(name):
    schedule, expected = STRUCTURE[name]
    k = apply(matmul_kernel(), schedule)
    assert body(k) == expected
    assert k.schedule == schedule and body(Kernel(k.name, k.op, k.params, k.lowered)) == LOWERED


# refusals: one test each -------------------------------------------------------------------------

VECTOR_CFG = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, layers=2, vocab=176, tied=True)


def kernel(prefix, **cfg):
    m = compile_model(tiny_config(**cfg), schedule=False)
    return next(k for k in m.kernels.values() if k.name.startswith(prefix))


def carry_kernel():
    """A hand-written kernel whose output loop carries a sum: its lanes would carry it."""
    return Kernel("carry", "sum", (Param("p0", "f32", "write"), Param("p1", "f32", "read")),
                  (AccInit("acc", "f32", FConst(0.0)),
                   Loop("i0", IConst(32), (AccUpdate("acc", Bin("+", Acc("acc"), Load("p1", Var("i0")))),
                                           Store("p0", Var("i0"), Acc("acc"))))))


def sum_then_store_kernel(stored: str):
    """Rows of 8: a sum over the row of p1, then a loop storing the row's elements divided by it
    into `stored` (p0, or p1 itself: the next row's sum would read what this row stores)."""
    row = Bin("*", Var("i0"), IConst(8))
    return Kernel("rowsum", "div", (Param("p0", "f32", "write"), Param("p1", "f32", "write")),
                  (Loop("i0", IConst(4), (
                      AccInit("acc", "f32", FConst(0.0)),
                      Loop("r", IConst(8), (AccUpdate("acc", Bin("+", Acc("acc"), Load("p1", Bin("+", row, Var("r"))))),),
                           role=REDUCTION),
                      Loop("i1", IConst(8), (Store(stored, Bin("+", row, Var("i1")),
                                                   Bin("/", Load("p1", Bin("+", row, Var("i1"))), Acc("acc"))),)))),))


def lane_arithmetic_kernel():
    """A position computed from the column: integer arithmetic that differs between lanes."""
    return Kernel("iota", "cast", (Param("p0", "f32", "write"),),
                  (Loop("i0", IConst(32), (Store("p0", Var("i0"), Bin("*", Var("i0"), FConst(1.0))),)),))


MM, RMS, QPROJ, ROPE = ("matmul2_exp_mul", {}), ("rowreduce_sqrt_mul", {}), ("matmul_add_seqx64", VECTOR_CFG), \
    ("select_add", VECTOR_CFG)

REFUSALS = {
    "parallel reduction loop": (MM, (Parallel("k"),), "carries the reduction 'acc'"),
    "parallel missing loop": (MM, (Parallel("i7"),), "no loop 'i7'"),
    "parallel nested": (MM, (Parallel("i0"), Parallel("i1")), "nested in or around another parallel loop"),
    "parallel row reduction": (RMS, (Parallel("r"),), "carries the reduction"),
    "unknown directive": (RMS, ("vectorize",), "unknown schedule directive"),
    "unroll-jam reduction loop": (MM, (UnrollJam("k", 2),), "is a reduction loop"),
    "unroll-jam non-multiple": (MM, (UnrollJam("i1", 5),), "72 iterations is not a multiple of 5"),
    "unroll-jam without one reduction": (RMS, (UnrollJam("i1", 2),), "exactly one reduction loop"),
    "unroll-jam symbolic": (RMS, (UnrollJam("i0", 2),), "a symbolic number of iterations"),
    "unroll reduction loop": (RMS, (Unroll("r", 2),), "'r' is a reduction loop; unrolling it would reorder a sum"),
    "unroll non-multiple": (MM, (Unroll("i1", 5),), "is not a multiple of 5; Split it first"),
    "unroll after parallel": (MM, (Parallel("i1"), Unroll("i1", 2)), "already parallel; Unroll comes before Parallel"),
    "vectorize reduction loop": (QPROJ, (Vectorize("k", 16),), "'k' is a reduction loop; its lanes would carry"),
    "vectorize unknown width": (QPROJ, (Vectorize("i1", 12),), "12 lanes"),
    "vectorize symbolic": (QPROJ, (Vectorize("i0", 16),), "'i0' of a symbolic number of iterations is not a multiple"),
    "vectorize strided load": (QPROJ, (Vectorize("i1", 16),), r"read p2 with stride 64; Pack\(p2, ...\) makes"),
    "pack vector stores": (QPROJ, (Vectorize("i1", 16), Pack("p0", 64, 16)), "p0 is stored from a vector loop"),
    "pack across rows": (QPROJ, (Vectorize("i1", 16), Pack("p2", 32, 16)), "read across rows of 32"),
    "pack partial vectors": (QPROJ, (Vectorize("i1", 16), Pack("p2", 64, 24)), "blocks of 24 rows do not hold whole"),
    "vectorize nested": (QPROJ, (Vectorize("i1", 16), Pack("p2", 64, 16), Split("i0", 16), Vectorize("i0i", 16)),
                         "nested in or around another vectorized loop"),
    "reorder reduction loop": (QPROJ, (Reorder("i1", "k"),), "'k' is a reduction loop; reordering it would"),
    "reorder imperfect nest": (("rowreduce_sqrt_mul", VECTOR_CFG), (Reorder("i0", "i1"),), "must hold only loop 'i1'"),
    "split reduction loop": (QPROJ, (Split("k", 4),), "is a reduction loop; splitting it would reorder a sum"),
    "split after parallel": (QPROJ, (Parallel("i1"), Split("i1", 4)), "already parallel; Split comes before"),
    "vectorize lane-dependent select": (ROPE, (Vectorize("i2", 16),), "select on a lane-dependent condition"),
    "parallel leaves a store to every thread": (MM, (Split("i1", 5), Parallel("i1o")),
                                                "store to p0 outside every parallel loop"),
    "prefetch rows outside the columns": (QPROJ, (Vectorize("i1", 16), Pack("p2", 64, 16), PrefetchNext("i1", "i0")),
                                          "the row loop 'i0' is not inside the column loop 'i1'"),
    "prefetch without a reduction": (RMS, (PrefetchNext("i0", "i1"),), "no reduction loop directly inside 'i1'"),
    "prefetch missing loop": (QPROJ, (PrefetchNext("i1", "i0o"),), "no output loop 'i0o'"),
    "fetch rows outside the columns": (QPROJ, (Vectorize("i1", 16), Pack("p2", 64, 16), FetchNextBlock("i1", "i0")),
                                       "the row loop 'i0' is not inside the column loop 'i1'"),
    "fetch without a block read step by step": (RMS, (FetchNextBlock("i0", "i1"),),
                                                "no weight inside 'i1' is read one contiguous block per iteration"),
    "fetch missing loop": (QPROJ, (FetchNextBlock("i1", "i0o"),), "no output loop 'i0o'"),
    "vectorize carried value": (carry_kernel, (Vectorize("i0", 16),), "carries 'acc' from one iteration to the"),
    "vectorize lane arithmetic": (lane_arithmetic_kernel, (Vectorize("i0", 16),),
                                  "integer arithmetic that differs between lanes"),
    "unroll-jam a sum before stores it reads": (lambda: sum_then_store_kernel("p1"), (UnrollJam("i0", 2),),
                                                "exactly one reduction loop"),
}


def test_unroll_jam_runs_rows_sums_side_by_side_before_their_stores():
    """Softmax's division: each row's sum, then a loop dividing the row by it. Jammed, the rows'
    sums share one loop (each adding its own terms in order) and each row's loop follows."""
    k = apply(sum_then_store_kernel("p0"), (UnrollJam("i0", 2),))
    text = body(k)
    assert text.count("reduce r in 0..8:") == 1 and text.count("for i1 in 0..8:") == 2, text
    assert text.index("acc_1 = (acc_1 +") < text.index("for i1 in 0..8:"), text


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusal(case):
    source, schedule, message = REFUSALS[case]
    k = source() if callable(source) else kernel(source[0], **source[1])
    with pytest.raises(ScheduleError, match=message):
        apply(k, schedule)


@pytest.mark.slow
def test_a_select_the_same_in_every_lane_vectorizes():
    """RoPE reads the other half of its row. With halves of whole vectors (head_dim 64, 16 lanes),
    a vector's lanes are all in one half: the condition loses the lane, and only the side it
    chooses is read (a C conditional in the vector code). Halves of 8 with 16 lanes stay refused
    (the refusal case above)."""
    k = kernel("select_add", **dict(VECTOR_CFG, hidden=128, heads=2, kv_heads=1, head_dim=64))
    text = body(apply(k, (Vectorize("i2", 16), Parallel("i0"))))
    assert "select(((i2 * 16) < 32)," in text, text
    c = render_tree(compile_model(tiny_config(**dict(VECTOR_CFG, hidden=128, heads=2, kv_heads=1, head_dim=64)),
                                  march="x86-64-v4"))["model.c"]
    assert "((i2 * 16) < 32) ? " in c


@pytest.mark.parametrize("march", ["x86-64-v4", "x86-64-v3"])
def test_prefetches_of_the_row_tiles_cover_the_next_block(march):
    """Each projection's row tiles fetch the next column block: over the row tiles r mod n and the
    reduction steps, their prefetches touch every cache line of the block after the one the
    tile reads, and nothing outside it (SwiGLU's two weights each take a part of a line a step)."""
    m = compile_model(tiny_config(**dict(VECTOR_CFG, hidden=128, ffn=256)), march=march)
    fetched = 0
    for k in m.kernels.values():
        if not any(isinstance(d, PrefetchNext) for d in k.schedule):
            continue
        found = [(s, outer) for s, outer in statements_in_loops(k.body) if isinstance(s, Prefetch)]
        dtype_bytes = {p.name: 4 for p in k.params}
        for fetch, outer in found:
            reduction, columns = outer[-1], next(lp for lp in outer if lp.parallel)
            terms, const = linear(fetch.index)
            per_column = terms.pop(Var(columns.var))
            assert const == per_column, fetch  # the next block: one column iteration on
            mod = [a for a in terms if isinstance(a, Bin) and a.op == "%"]
            parts = mod[0].b.value if mod else 1
            lines = {(const + (r * terms[mod[0]] if mod else 0) + step * terms[Var(reduction.var)])
                     * dtype_bytes[fetch.param] // 64 for r in range(parts) for step in range(reduction.extent.value)}
            block = {(per_column * dtype_bytes[fetch.param] + b) // 64 for b in range(0, per_column * 4, 64)}
            assert lines == block, (k.name, fetch)
            fetched += 1
    assert fetched >= 5, "every f32 projection tiled in rows fetches its next block"


def next_block_lines(k, fetch, outer) -> tuple[set, set]:
    """(the lines a FetchNextBlock prefetch touches over the reduction's steps and its line loop,
    run by the first row tile; the lines of the block after the one the column iteration reads),
    in the parameter's storage (narrow quants in their bytes)."""
    line, reduction = outer[-1], outer[-2]
    columns = next(lp for lp in outer if lp.parallel)
    assert line.var.endswith("_line") and isinstance(line.extent, Select), line
    tile = line.extent.cond
    assert tile == Bin("<", tile.a, IConst(1)) and line.extent.b == IConst(0), line.extent  # the first tile only
    size = {"f32": 4, "f16": 2, "i8": 1}[next(p.dtype for p in k.params if p.name == fetch.param)]
    terms, const = linear(fetch.index)
    per_column = terms.pop(Var(columns.var))
    assert const == per_column, fetch  # one column iteration on
    packed = next(d for d in k.schedule if isinstance(d, Pack) and d.param == fetch.param)
    assert per_column * size * 8 == packed.row * packed.block * size * packed.bits, (fetch, packed)  # a block as stored
    step, per_line = terms.pop(Var(reduction.var)), terms.pop(Var(line.var))
    assert not terms and per_line * size == 64, fetch
    touched = {(const + b * step + i * per_line) * size // 64
               for b in range(reduction.extent.value) for i in range(line.extent.a.value)}
    block = {(per_column * size + x) // 64 for x in range(0, per_column * size, 64)}
    return touched, block


def native_k_module(tmp_path, march):
    """The tiny GGUF with Q4_K, Q6_K and Q5_0 matrices (helpers.write_k_gguf), compiled native:
    its quants kept in 4, 5 and 6 bits at 16 and 8 lanes, K formats as super-blocks."""
    from nanocompile.engine.open import open_model
    from nanocompile.models import load_model

    return open_model(load_model(write_k_gguf(tmp_path / "k.gguf"), progress=False), "native", march).compile(
        out=lambda _: None)


@pytest.mark.parametrize("precision", ["int8", "native"])
@pytest.mark.parametrize("march", ["x86-64-v4+vnni", "x86-64-v3"])
def test_first_row_tile_fetches_the_next_block_of_every_quantized_weight(march, precision, tmp_path, monkeypatch):
    """Each quantized projection's first row tile (and first pair of rows) fetches the next column
    block while it reads one: every line of it, quants (narrow ones in their storage's bytes) and
    scales, and nothing outside it (a verify or batched step of a few rows has one tile, whose
    weights otherwise arrive from memory only when asked for)."""
    monkeypatch.setenv("NANOCOMPILE_CACHE", str(tmp_path / "cache"))
    m = compile_model(tiny_config(**dict(VECTOR_CFG, hidden=128, ffn=256, vocab=512)), precision="int8", march=march) \
        if precision == "int8" else native_k_module(tmp_path, march)
    fetched = set()
    for k in m.kernels.values():
        if not any(isinstance(d, FetchNextBlock) for d in k.schedule):
            continue
        for fetch, outer in statements_in_loops(k.body):
            if isinstance(fetch, Prefetch) and not fetch.near:  # near: FetchAhead's, below
                touched, block = next_block_lines(k, fetch, outer)
                assert touched == block, (k.name, fetch)
                fetched.add((k.name, fetch.param))
    quantized = {name for name, k in m.kernels.items()  # tiled in rows: split, the tile's rows jammed
                 if any(isinstance(d, Pack) and d.group == 4 for d in k.schedule)
                 and any(isinstance(d, Split) and UnrollJam(d.loop + "i", d.factor) in k.schedule for d in k.schedule)}
    assert quantized and {name for name, _ in fetched} == quantized, (sorted(fetched), sorted(quantized))
    if precision == "native":  # narrow quants among them, fetched in their own bytes
        assert any(Pack(p, d.row, d.block, d.group, d.offset, d.bits) in m.kernels[name].schedule and d.bits != 8
                   for name, p in fetched for d in m.kernels[name].schedule if isinstance(d, Pack) and d.param == p)


@pytest.mark.parametrize("ahead", [None, 2048])  # the shipped distances; 2 KiB at both levels
@pytest.mark.parametrize("precision", ["int8", "native"])
@pytest.mark.parametrize("march", ["x86-64-v4+vnni", "x86-64-v3"])
def test_a_single_row_fetches_its_quants_a_distance_ahead(march, precision, ahead, tmp_path, monkeypatch):
    """Every quantized projection's single row (the one left after the tiles; or every row where
    there are no tiles: a decode step's head) fetches its quants FETCH_AHEAD bytes ahead into L1,
    a few lines a step: over a column iteration, every line of the block's bytes that distance
    on, and at most one line more (a step of 160 bytes fetches 3 lines). At a level whose
    distance is 0 (16 lanes), nothing."""
    from nanocompile.schedule import recipes

    if ahead:
        monkeypatch.setattr(recipes, "FETCH_AHEAD", {8: ahead, 16: ahead})
    monkeypatch.setenv("NANOCOMPILE_CACHE", str(tmp_path / "cache"))
    m = compile_model(tiny_config(**dict(VECTOR_CFG, hidden=128, ffn=256, vocab=512)), precision="int8", march=march) \
        if precision == "int8" else native_k_module(tmp_path, march)
    distance = recipes.FETCH_AHEAD[16 if march.startswith("x86-64-v4") else 8]
    fetched = set()
    for k in m.kernels.values():
        for fetch, outer in statements_in_loops(k.body):
            if not (isinstance(fetch, Prefetch) and fetch.near):
                continue
            assert distance, (k.name, "a level without FetchAhead fetches nothing ahead", fetch)
            line = outer[-1]
            assert line.var.endswith("_ahead") and isinstance(line.extent, IConst), line
            columns = next(lp for lp in outer if lp.parallel)
            terms, const = linear(fetch.index)
            per_column = terms.pop(Var(columns.var))
            steps = [(lp.extent.value, terms.pop(Var(lp.var))) for lp in outer if Var(lp.var) in terms]
            assert not terms and const >= distance, fetch
            touched = {const // 64}
            for extent, step in steps:
                touched = {t + (i * step) // 64 for t in touched for i in range(extent)} if step % 64 == 0 else \
                    {(t * 64 + i * step) // 64 for t in touched for i in range(extent)}
            block = {(const + x) // 64 for x in range(0, per_column, 64)}
            assert block <= touched and len(touched - block) <= 1, (k.name, fetch)
            fetched.add(k.name)
    quantized = {name for name, k in m.kernels.items()  # products (the embedding's gather packs alike)
                 if name.startswith("matmul") and any(isinstance(d, Pack) and d.group == 4 for d in k.schedule)}
    assert quantized and fetched == (quantized if distance else set()), (sorted(fetched), sorted(quantized))


def test_split_of_a_symbolic_multiple_leaves_no_tail():
    """Attention's rows are 2*seq here (two query heads per key-value head): split by 2, the
    outer loop runs seq times and there is no tail loop."""
    k = apply(kernel("matmul_store", **VECTOR_CFG), (Split("i1", 2),))
    text = body(k)
    assert "for i1o in 0..seq:" in text and "i1t" not in text, text


# the recipes -------------------------------------------------------------------------------------

def test_schedule_is_printed_above_the_kernel():
    """The recipe for the target this suite builds for, as C comments: SwiGLU's 72 columns are
    whole vectors of AVX2's 8 lanes but not of AVX-512's 16."""
    module = compile_model(tiny_config(ffn=72))
    c = render_tree(module)["model.c"]
    k = next(k for k in module.kernels.values() if k.name.startswith("matmul2_exp_mul"))
    assert k.schedule and f" *   schedule: {', '.join(str(d) for d in k.schedule)}" in c
    assert "nc_split(" in c
    lanes = target_lanes()
    vectorized = bool(lanes) and 72 % lanes == 0
    assert (Vectorize("i1", lanes) in k.schedule) == vectorized, (lanes, k.schedule)
    if not vectorized:
        assert k.schedule == (UnrollJam("i1", 8), Parallel("i1"))


@pytest.mark.parametrize("march, rows, vectors", [("x86-64-v4+vnni", 8, 1), ("x86-64-v3", 4, 2)])
def test_output_head_takes_a_verify_steps_rows_in_one_tile(march, rows, vectors):
    """The head over every row's logits runs on a verify step's or a batched step's rows (a prompt
    reads only its last row's): at 16 lanes its tile is 8 rows of one column vector, not the
    projections' 6 of 2, and the one-row head packs the weight alike (one layout for both); at 8
    lanes it is the projections' tile."""
    m = compile_model(tiny_config(**dict(VECTOR_CFG, hidden=128, ffn=256, vocab=512)), precision="int8", march=march)
    lanes = 16 if rows == 8 else 8
    every_row = next(k for n, k in m.kernels.items() if n.startswith("matmul_store_seqx512"))
    last_row = next(k for n, k in m.kernels.items() if n.startswith("matmul_store_1x512"))
    assert Split("i0", rows) in every_row.schedule and UnrollJam("i0i", rows) in every_row.schedule, every_row.schedule
    packs = [{(d.row, d.block) for d in k.schedule if isinstance(d, Pack)} for k in (every_row, last_row)]
    assert packs[0] == packs[1] and {block for _, block in packs[0]} == {lanes * vectors}, packs
    projection = next(k for n, k in m.kernels.items() if n.startswith("matmul2_exp_mul"))
    assert Split("i0", 6 if lanes == 16 else 4) in projection.schedule, projection.schedule


def test_default_recipe_parallelizes_every_large_kernel():
    m = compile_model(tiny_config(hidden=64, ffn=256, vocab=512))
    for k in m.kernels.values():
        if k.name.startswith(("matmul", "rowreduce")):
            assert any(isinstance(d, Parallel) for d in k.schedule), k.name


@pytest.mark.parametrize("march, lanes", [("x86-64-v4", 16), ("x86-64-v3", 8)])
def test_recipes_vectorize_pack_and_tile_the_projections(march, lanes):
    """Compiling for a level needs no CPU of that level: both recipes are checked everywhere."""
    m = compile_model(tiny_config(**VECTOR_CFG), march=march)
    by_name = {k.name: k for k in m.kernels.values()}
    projections = [k for n, k in by_name.items() if n.startswith("matmul") and any(isinstance(d, Pack)
                                                                                for d in k.schedule)
                   and "past" not in n]  # attention's scores pack the K cache (tests/test_attention.py)
    assert len(projections) >= 5, list(by_name)
    assert all(Vectorize("i1", lanes) in k.schedule for k in projections)
    packed = {w.name: w.packed for w in m.weights}
    assert packed["model.layers.0.mlp.down_proj.weight"][0] == 96
    assert packed["model.embed_tokens.weight"], "the tied embedding is packed for the logits"
    assert [d for d in by_name["gather_seqx64"].schedule if isinstance(d, Pack)], "the gather reads it packed"
    assert f"nc_load{lanes}(" in render_tree(m)["model.c"]


def test_target_level_can_be_forced(monkeypatch):
    """NANOCOMPILE_MARCH builds for a lower level than the CPU's: how the suite runs AVX2 code here."""
    monkeypatch.setenv("NANOCOMPILE_MARCH", "x86-64-v3")
    if target_level() != "x86-64-v3":
        pytest.fail(f"NANOCOMPILE_MARCH=x86-64-v3 gave {target_level()}")
    assert compile_model(tiny_config()).march == "x86-64-v3"
    monkeypatch.setenv("NANOCOMPILE_MARCH", "x86-64-v9")
    with pytest.raises(ValueError, match="unknown x86-64 level"):
        compile_model(tiny_config())

