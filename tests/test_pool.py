"""The thread pool (runtime/nc_pool.c) on its own, through tests/pool_stress.c: every chunk of
every call runs exactly once, the calls in order, each call's chunk count asked once, at 1, 2, 3,
8 and 24 threads (more threads than cores), built plain, with ThreadSanitizer, and with
AddressSanitizer and UndefinedBehaviorSanitizer; passes shared between threads and passes run
on the calling thread alone both occur."""
import os
import subprocess
from pathlib import Path

import pytest

from nanocompile.codegen.data import data_root

THREADS = (1, 2, 3, 8, 24)
BUILDS = {  # name: (compiler flags, passes per thread count)
    "plain": (["-O2"], 1000),
    "tsan": (["-O1", "-g", "-fsanitize=thread"], 200),
    "asan": (["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"], 200),
}


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_every_chunk_runs_once_and_calls_run_in_order(build, cc, tmp_path):
    flags, passes = BUILDS[build]
    runtime = data_root() / "runtime"
    exe = tmp_path / f"pool_stress_{build}"
    cmd = [cc, "-std=gnu11", "-Wall", "-Wextra", "-Werror", *flags, "-I", str(runtime),
           str(Path(__file__).with_name("pool_stress.c")), str(runtime / "nc_pool.c"), "-o", str(exe), "-lpthread"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    env = {**os.environ, "TSAN_OPTIONS": "halt_on_error=1 exitcode=66", "ASAN_OPTIONS": "detect_leaks=1"}
    for threads in THREADS:
        r = subprocess.run([str(exe), str(threads), str(passes)], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0 and r.stdout.startswith("ok "), (threads, r.stderr[-3000:])
        assert "WARNING: ThreadSanitizer" not in r.stderr and "ERROR: AddressSanitizer" not in r.stderr
        shared, alone = map(int, r.stdout.split()[1:])
        if threads == 1:
            assert (shared, alone) == (0, passes)
        elif build == "plain":  # light passes go to one thread, heavy ones are shared again
            assert shared > 0 and alone > 0, (threads, shared, alone)
        else:  # a sanitizer slows every call several-fold: light passes may stay above the grain
            assert shared > 0, (threads, shared, alone)


def test_the_stress_harness_catches_a_pool_that_runs_a_chunk_twice(cc, tmp_path):
    """The harness can fail: a pool whose workers also run chunk 0 of every call is refused."""
    runtime = data_root() / "runtime"
    broken = tmp_path / "nc_pool.c"
    text = (runtime / "nc_pool.c").read_text()
    needle = "    p->run(p->ctx, call, (int)chunk, (int)chunks);\n"
    assert needle in text
    broken.write_text(text.replace(needle, needle + "    if (chunk != 0) p->run(p->ctx, call, 0, (int)chunks);\n"))
    exe = tmp_path / "pool_broken"
    r = subprocess.run([cc, "-std=gnu11", "-O1", "-I", str(runtime), str(Path(__file__).with_name("pool_stress.c")),
                        str(broken), "-o", str(exe), "-lpthread"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe), "2", "50"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
