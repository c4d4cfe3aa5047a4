"""Schedules: data, checked where applied, and bitwise identical to the unscheduled kernel at
1, 2, 3 and 8 threads, with guard regions around every output."""
import subprocess

import numpy as np
import pytest

from nanocompile.build import cmake_build
from nanocompile.codegen.graph_library import GraphLibrary
from nanocompile.compiler import compile_model
from nanocompile.library import CompiledSession
from nanocompile.schedule import Parallel, ScheduleError, UnrollJam, _loops, apply

from model_files import random_weights, tiny_config
from test_primitives_c import BOUNDED, ENVS, EXACT, _feeds, _graph

THREADS = (1, 2, 3, 8)


def _kernel(name):
    m = compile_model(tiny_config(), schedule=False)
    return next(k for k in m.kernels.values() if k.name.startswith(name))


def test_illegal_schedules_are_refused():
    mm = _kernel("matmul2_exp_mul")
    with pytest.raises(ScheduleError, match="carries the reduction 'acc'"):
        apply(mm, (Parallel("k"),))
    with pytest.raises(ScheduleError, match="no loop 'i7'"):
        apply(mm, (Parallel("i7"),))
    with pytest.raises(ScheduleError, match="nested in or around another parallel loop"):
        apply(mm, (Parallel("i0"), Parallel("i1")))
    rms = _kernel("rowreduce_sqrt_mul")
    with pytest.raises(ScheduleError, match="carries the reduction"):
        apply(rms, (Parallel("r"),))
    with pytest.raises(ScheduleError, match="unknown schedule directive"):
        apply(rms, ("vectorize",))
    with pytest.raises(ScheduleError, match="is a reduction loop"):
        apply(mm, (UnrollJam("k", 2),))
    with pytest.raises(ScheduleError, match="72 iterations is not a multiple of 5"):
        apply(mm, (UnrollJam("i1", 5),))
    with pytest.raises(ScheduleError, match="exactly one reduction loop"):
        apply(rms, (UnrollJam("i1", 2),))
    with pytest.raises(ScheduleError, match="a symbolic number of iterations"):
        apply(rms, (UnrollJam("i0", 2),))


def test_schedule_is_printed_above_the_kernel():
    from nanocompile.codegen.render import render_tree
    c = render_tree(compile_model(tiny_config()))["model.c"]
    assert " *   schedule: UnrollJam(i1, 8), Parallel(i1)" in c
    assert "nc_split(9, thread, n_threads, &i1_lo, &i1_hi);" in c


def _every_parallel_choice(k):
    """Each legal Parallel directive of a kernel, alone and after each legal UnrollJam of the
    same loop, and no schedule at all."""
    choices = [()]
    for var in sorted({s.var for s in _loops(k.body)}):
        for schedule in [(Parallel(var),)] + [(UnrollJam(var, f), Parallel(var)) for f in (2, 3, 4, 8)]:
            try:
                apply(k, schedule)
                choices.append(schedule)
            except ScheduleError:
                pass
    return choices


@pytest.mark.parametrize("name", sorted(EXACT) + sorted(BOUNDED))
def test_every_schedule_choice_is_bitwise_at_every_thread_count(name):
    """Shapes in the primitive tests leave tails: 6, 19, 37 and 11 columns."""
    g = _graph(name, {**EXACT, **BOUNDED}[name])
    base = GraphLibrary(g, fuse=True)
    rng = np.random.default_rng(3)
    kernels = _program_kernels(g)
    grid = [dict()]
    for kname, k in kernels.items():
        for choice in _every_parallel_choice(k)[1:]:
            grid.append({kname: choice})
    for assignment in grid:
        lib = GraphLibrary(g, fuse=True, schedule=lambda k, a=assignment: a.get(k.name, ()))
        for env in ENVS[::2]:
            inputs, weights = _feeds(g, env, rng)
            want = base.run(env, inputs, weights)
            for threads in THREADS:
                got = lib.run(env, inputs, weights, threads=threads)
                for key in want:
                    assert np.array_equal(want[key].view(np.uint8), got[key].view(np.uint8)), (assignment, env, threads)


def _program_kernels(g):
    from nanocompile.compiler import optimize
    from nanocompile.loopir.lower import lower
    graph, plan = optimize(g)
    return lower(graph, g.name, model=False, plan=plan).kernels


def test_model_bitwise_at_every_thread_count_and_when_it_changes():
    cfg = tiny_config(hidden=45, heads=3, kv_heads=1, head_dim=14, ffn=97, layers=3, vocab=211, tied=True)
    w = random_weights(cfg, seed=3)
    base = CompiledSession(cfg, w, n_ctx=100, schedule=False)
    ids = list(range(1, 80))  # two chunks
    want = [base.step(ids, all_logits=True)] + [base.step([t]) for t in (5, 6, 7, 8)]
    for threads in THREADS:
        s = CompiledSession(cfg, w, n_ctx=100, threads=threads)
        got = [s.step(ids, all_logits=True)] + [s.step([t]) for t in (5, 6, 7, 8)]
        assert all(np.array_equal(a, b) for a, b in zip(want, got)), threads
    s = CompiledSession(cfg, w, n_ctx=100, threads=2)
    got = [s.step(ids, all_logits=True)]
    for threads, t in zip((3, 1, 8, 2), (5, 6, 7, 8)):
        s.set_threads(threads)
        got.append(s.step([t]))
    assert all(np.array_equal(a, b) for a, b in zip(want, got))


def test_default_recipe_parallelizes_every_large_kernel():
    m = compile_model(tiny_config(hidden=64, ffn=256, vocab=512))
    for k in m.kernels.values():
        if k.name.startswith(("matmul", "rowreduce")):
            assert k.schedule, k.name


def test_thread_sanitizer_build_changing_threads_between_steps(tmp_path):
    """The tiny model's library built with -fsanitize=thread; the C driver resizes the pool
    before every step. ThreadSanitizer exits non-zero on a data race."""
    from nanocompile.generate import write_tree
    from nanocompile.pack import pack_weights

    cfg = tiny_config()
    module = compile_model(cfg)
    write_tree(module, tmp_path / "src")
    pack_weights(module, random_weights(cfg, seed=1), tmp_path / "weights.bin")
    cmake_build(tmp_path / "src", tmp_path / "tsan", {"CMAKE_BUILD_TYPE": "Debug", "NANOCOMPILE_TSAN": "ON"})
    driver = next(p for p in (tmp_path / "tsan").iterdir() if p.name.endswith("_driver"))
    env = {"NANOCOMPILE_THREADS": "2,3,1,4", "TSAN_OPTIONS": "halt_on_error=1 exitcode=66"}
    r = subprocess.run([str(driver), str(tmp_path / "weights.bin"), "8"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "WARNING: ThreadSanitizer" not in r.stderr
    single = subprocess.run([str(driver), str(tmp_path / "weights.bin"), "8"], capture_output=True, text=True)
    assert r.stdout == single.stdout  # the same logits, bit for bit, whatever the threads
