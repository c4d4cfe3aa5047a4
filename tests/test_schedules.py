"""Schedules: data, checked where applied, and bitwise identical to the unscheduled kernel at
1, 2, 3 and 8 threads, with guard regions around every output."""
import subprocess

import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config
from helpers import BOUNDED, ENVS, EXACT, LEVELS, THREADS, feeds, graph_kernels, make_graph, require_lanes, require_level

from nanocompile.codegen.tree import write_tree
from nanocompile.compiler.build import cmake_build
from nanocompile.compiler.driver import compile_model
from nanocompile.compiler.graph_library import GraphLibrary
from nanocompile.engine.compiled import CompiledSession
from nanocompile.engine.pack import pack_weights
from nanocompile.ir import SEQ
from nanocompile.loopir.traverse import loops
from nanocompile.schedule import Pack, Parallel, Reorder, Split, Unroll, UnrollJam, Vectorize, is_legal

pytestmark = pytest.mark.c


def _every_parallel_choice(k):
    """Each legal Parallel directive of a kernel, alone and after each legal UnrollJam of the
    same loop, and no schedule at all."""
    choices = [()]
    for var in sorted({s.var for s in loops(k.body)}):
        for schedule in [(Parallel(var),)] + [(UnrollJam(var, f), Parallel(var)) for f in (2, 3, 4, 8)] + \
                [(Unroll(var, f), Parallel(var)) for f in (2, 3)] + [(Unroll(var, 2),)]:
            if is_legal(k, schedule):
                choices.append(schedule)
    return choices


@pytest.mark.levels
@pytest.mark.parametrize("name", sorted(EXACT) + sorted(BOUNDED))
def test_every_schedule_choice_is_bitwise_at_every_thread_count(name):
    """Shapes in the primitive tests leave tails: 6, 19, 37 and 11 columns."""
    g = make_graph(name, {**EXACT, **BOUNDED}[name])
    base = GraphLibrary(g, fuse=True)
    rng = np.random.default_rng(3)
    kernels = graph_kernels(g)
    grid = [dict()]
    for kname, k in kernels.items():
        for choice in _every_parallel_choice(k)[1:]:
            grid.append({kname: choice})
    for assignment in grid:
        lib = GraphLibrary(g, fuse=True, schedule=lambda k, a=assignment: a.get(k.name, ()))
        for env in ENVS[::2]:
            inputs, weights = feeds(g, env, rng)
            want = base.run(env, inputs, weights)
            for threads in THREADS:
                got = lib.run(env, inputs, weights, threads=threads)
                for key in want:
                    assert np.array_equal(want[key].view(np.uint8), got[key].view(np.uint8)), (assignment, env, threads)


@pytest.mark.levels
def test_model_bitwise_at_every_thread_count_and_when_it_changes():
    cfg = tiny_config(hidden=45, heads=3, kv_heads=1, head_dim=14, ffn=97, layers=3, vocab=211, tied=True)
    w = random_weights(cfg, seed=3)
    base = CompiledSession.from_weights(cfg, w, n_ctx=100, schedule=False)
    ids = list(range(1, 80))  # two chunks
    want = [base.step(ids, all_logits=True)] + [base.step([t]) for t in (5, 6, 7, 8)]
    for threads in THREADS:
        s = CompiledSession.from_weights(cfg, w, n_ctx=100, threads=threads)
        got = [s.step(ids, all_logits=True)] + [s.step([t]) for t in (5, 6, 7, 8)]
        assert all(np.array_equal(a, b) for a, b in zip(want, got)), threads
    s = CompiledSession.from_weights(cfg, w, n_ctx=100, threads=2)
    got = [s.step(ids, all_logits=True)]
    for threads, t in zip((3, 1, 8, 2), (5, 6, 7, 8)):
        s.set_threads(threads)
        got.append(s.step([t]))
    assert all(np.array_equal(a, b) for a, b in zip(want, got))


@pytest.mark.levels
def test_thread_sanitizer_build_changing_threads_between_steps(tmp_path):
    """The tiny model's library built with -fsanitize=thread; the C driver resizes the pool
    before every step, and each of THREADS runs the prompt once. ThreadSanitizer exits non-zero
    on a data race."""

    cfg = tiny_config()
    module = compile_model(cfg)
    write_tree(module, tmp_path / "src")
    pack_weights(module, random_weights(cfg, seed=1), tmp_path / "weights.bin")
    cmake_build(tmp_path / "src", tmp_path / "tsan", {"CMAKE_BUILD_TYPE": "Debug", "NANOCOMPILE_TSAN": "ON"})
    driver = next(p for p in (tmp_path / "tsan").iterdir() if p.name.endswith("_driver"))
    run = [str(driver), str(tmp_path / "weights.bin"), "12", *map(str, range(3, 40, 3))]
    single = subprocess.run(run, capture_output=True, text=True)
    assert single.returncode == 0, single.stderr[-3000:]
    for i in range(len(THREADS)):
        order = THREADS[i:] + THREADS[:i]
        env = {"NANOCOMPILE_THREADS": ",".join(map(str, order)), "TSAN_OPTIONS": "halt_on_error=1 exitcode=66"}
        r = subprocess.run(run, capture_output=True, text=True, env=env)
        assert r.returncode == 0, (order, r.stderr[-3000:])
        assert "WARNING: ThreadSanitizer" not in r.stderr
        assert r.stdout == single.stdout  # the same logits, bit for bit, whatever the threads


# vector code, packing, split and reorder ---------------------------------------------------------

VECTOR_CFG = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, layers=2, vocab=176, tied=True)


SEQS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 13)  # every tail of the row tiles (4) and the key splits (8)


@pytest.mark.parametrize("march", LEVELS)
def test_vectorized_model_is_bitwise_at_every_thread_count(march):
    """AVX-512 (16 lanes) and AVX2 (8 lanes) builds against the unscheduled one: chunks of every
    tail length, then cached steps, at 1, 2, 3 and 8 threads."""
    require_level(march)
    cfg = tiny_config(**VECTOR_CFG)
    w = random_weights(cfg, seed=5)
    base = CompiledSession.from_weights(cfg, w, n_ctx=120, schedule=False)
    ids = iter(range(3, 170))
    chunks = [[next(ids) for _ in range(n)] for n in SEQS]
    want = [base.step(c, all_logits=True) for c in chunks]
    for threads in THREADS:
        s = CompiledSession.from_weights(cfg, w, n_ctx=120, threads=threads, march=march)
        got = [s.step(c, all_logits=True) for c in chunks]
        for n, a, b in zip(SEQS, want, got):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (march, threads, n)
        for layer in range(cfg.num_hidden_layers):
            for a, b in zip(s.read_cache(layer), base.read_cache(layer)):
                assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (march, threads, layer)
        s.close()


@pytest.mark.parametrize("lanes", [16, 8])
@pytest.mark.parametrize("name", ["matmul", "reduce_sum", "exp", "add"])
def test_vector_recipes_on_primitives_with_guards(name, lanes):
    """The recipes on single primitives whose columns are a multiple of the lanes and whose rows
    leave tails, with guard regions around every output, at 1, 2, 3 and 8 threads."""
    require_lanes(lanes)
    builders = {
        "matmul": lambda b: b.matmul(b.input("x", [SEQ, 48]), b.permute(b.weight("w", [32, 48]), [1, 0])),
        "reduce_sum": lambda b: b.mul(b.input("x", [SEQ, 32]), b.broadcast(
            b.reshape(b.reduce_sum(b.input("y", [SEQ, 32]), 1), [SEQ, 1]), [SEQ, 32])),
        "exp": lambda b: b.exp(b.input("x", [SEQ, 32])),
        "add": lambda b: b.add(b.input("x", [SEQ, 32]), b.broadcast(b.reshape(b.weight("w", [32]), [1, 32]),
                                                                     [SEQ, 32])),
    }
    g = make_graph(name, builders[name])
    base = GraphLibrary(g, fuse=True)
    lib = GraphLibrary(g, fuse=True, schedule="default", lanes=lanes)
    assert f"nc_load{lanes}(" in lib.source, "the recipe vectorized nothing"
    rng = np.random.default_rng(11)
    for seq in (1, 3, 5, 6, 7, 9):
        env = {"seq": seq, "past": 0}
        inputs, weights = feeds(g, env, rng)
        want = base.run(env, inputs, weights)
        for threads in THREADS:
            got = lib.run(env, inputs, weights, threads=threads)
            for key in want:
                assert np.array_equal(want[key].view(np.uint8), got[key].view(np.uint8)), (seq, threads)


def _matmul_grid(lanes):
    """Schedules for a [seq, 48] x [48, 64] matmul beyond the recipe: vector width, columns per
    tile, row tiles that leave every tail of seq 1..9, with and without moving rows inside."""
    grid = []
    for columns in (1, 2, 4):
        if 64 % (lanes * columns):
            continue
        head = [Vectorize("i1", lanes)] + ([UnrollJam("i1", columns)] if columns > 1 else []) + \
            [Pack("p2", 48, lanes * columns)]
        grid.append(head + [Parallel("i1")])
        grid.append(head + [Parallel("i0")])
        for rows in (2, 3, 5):
            grid.append(head + [Reorder("i0", "i1"), Split("i0", rows), UnrollJam("i0i", rows), Parallel("i1")])
        grid.append(head + [Split("i0", 4), Parallel("i0o"), Parallel("i0t")])
    return grid


@pytest.mark.parametrize("lanes", [16, 8])
def test_grid_of_vector_schedules_is_bitwise_with_guards(lanes):
    require_lanes(lanes)
    g = make_graph("matmul", lambda b: b.matmul(b.input("x", [SEQ, 48]), b.permute(b.weight("w", [64, 48]), [1, 0])))
    base = GraphLibrary(g, fuse=True)
    rng = np.random.default_rng(12)
    envs = [{"seq": s, "past": 0} for s in range(1, 10)]
    cases = [(env, *feeds(g, env, rng)) for env in envs]
    wants = [base.run(env, i, w) for env, i, w in cases]
    kernel = next(k for k in graph_kernels(g).values() if k.name.startswith("matmul"))
    # the legal ones: one block of 64 columns has no i1 to split
    grid = [schedule for schedule in _matmul_grid(lanes) if is_legal(kernel, schedule)]
    assert len(grid) >= 8, len(grid)
    for schedule in grid:
        lib = GraphLibrary(g, fuse=True, schedule=lambda k, s=schedule: s if k.name.startswith("matmul") else ())
        for (env, inputs, weights), want in zip(cases, wants):
            for threads in THREADS:
                got = lib.run(env, inputs, weights, threads=threads)
                for key in want:
                    assert np.array_equal(want[key].view(np.uint8), got[key].view(np.uint8)), \
                        ([str(d) for d in schedule], env, threads)


@pytest.mark.parametrize("march", LEVELS)
def test_vector_code_builds_without_warnings(march, tmp_path):
    """The generated tree with vector kernels, through CMake with -Wall -Wextra, for AVX-512 and
    AVX2 targets."""
    m = compile_model(tiny_config(**VECTOR_CFG), march=march)
    write_tree(m, tmp_path / "src")
    assert "nc_load" in (tmp_path / "src" / "model.c").read_text()
    log = cmake_build(tmp_path / "src", tmp_path / "build")
    assert "warning:" not in log, log
