"""The tuner (issue 14): its search space, the bitwise check before timing, the alternated sign
test and its exact replay, the results file, and `nanocompile tune` end to end."""
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config, write_gguf

from nanocompile.compiler.driver import compile_model
from nanocompile.engine.compiled import CompiledSession
from nanocompile.loopir.ir import Bin, FConst, IConst, Store
from nanocompile.loopir.traverse import rewrite
from nanocompile.schedule import directives as D
from nanocompile.schedule.apply import apply, is_legal
from nanocompile.schedule.program import kernel_digest
from nanocompile.tune import store
from nanocompile.tune.harness import KernelHarness
from nanocompile.tune.search import Result, Trial, replay, search, sign_test
from nanocompile.tune.tuner import SHAPES, HarnessMeasure, cost, model_jobs

NC = [sys.executable, "-m", "nanocompile"]
CFG = tiny_config(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=320, max_pos=2048)


# the search, on made-up measurements -------------------------------------------------------------

class Synthetic:
    """Candidate i costs base[i] times noise; candidates in `wrong` fail their check."""

    def __init__(self, base, wrong=(), seed=0, noise=0.05):
        self.base, self.wrong, self.rng, self.noise = base, set(wrong), random.Random(seed), noise

    def check(self, which):
        return "out0 differs from the kernel as lowered in 4 of 64 bytes" if which in self.wrong else None

    def sample(self, which):
        return {s.name: self.base[which] * s.seq * (1 + self.noise * self.rng.random()) for s in SHAPES}


def test_sign_test_is_the_binomial_tail():
    assert sign_test(8, 8) == 1 / 256
    assert sign_test(7, 8) == 9 / 256        # C(8,7) + C(8,8) of 2^8
    assert sign_test(0, 8) == 1.0


def test_a_clearly_faster_candidate_wins_and_a_tie_does_not():
    m = Synthetic([1.0, 1.0, 0.5, 1.0], noise=0.0)
    r = search([1, 2, 3], 0, m, cost, lambda: False)
    outcomes = {t.candidate: t.outcome for t in r.trials}
    assert r.winner == 2 and outcomes == {1: "lost", 2: "won", 3: "screened"}  # 3 is 2x the new incumbent
    assert r.trials[0].wins == 0 and r.trials[1].wins == 8


def test_a_search_replays_exactly_from_its_record():
    base = [1.0, 1.02, 0.97, 0.9, 1.4, 0.88, 1.0, 0.7]
    order = list(range(1, len(base)))
    for budget in (3, 5, None):  # cut short after 3 or 5 candidates, or complete
        calls = iter(range(100))
        out_of_time = (lambda: False) if budget is None else (lambda: next(calls) >= budget)
        recorded = search(order, 0, Synthetic(base, wrong={3}, seed=budget or 1), cost, out_of_time)
        assert any(t.outcome == "dropped" for t in recorded.trials) == (budget is None or budget > 2)
        # through JSON, as the results file keeps it
        trials = [Trial.from_dict(json.loads(json.dumps(t.as_dict()))) for t in recorded.trials]
        again = replay(order, 0, Result(recorded.winner, trials, recorded.tried, recorded.complete), cost)
        assert (again.winner, again.tried, again.complete) == (recorded.winner, recorded.tried, recorded.complete)
        assert [t.as_dict() for t in again.trials] == [t.as_dict() for t in recorded.trials]


# the space and the results file ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("precision, march", [("f32", "x86-64-v3"), ("int8", "x86-64-v3"), ("int8", "x86-64-v4+vnni")])
def test_every_kernel_space_is_legal_and_holds_the_recipe(precision, march):
    jobs, _ = model_jobs(CFG, march, precision)
    classes = {j.klass for j in jobs}
    assert {"projection", "activation product", "symbolic columns", "row or elementwise"} <= classes
    for j in jobs:
        assert len(set(j.schedules)) == len(j.schedules) and all(is_legal(j.kernel, s) for s in j.schedules)
        assert j.schedules[j.recipe] == tuple(apply(j.kernel, j.schedules[j.recipe]).schedule)
        assert sorted(j.order) == [i for i in range(len(j.schedules)) if i != j.recipe]
    kind = "projection" if precision == "f32" else "int8 projection"
    projections = [j for j in jobs if j.klass == kind]
    assert max(len(j.schedules) for j in projections) > 10  # columns x rows, where legal
    if precision == "int8":  # every projection's weights int8, read by dot products; named apart from f32's
        assert all(j.name.endswith(" (int8)") for j in jobs)
        offset = 128 if march.endswith("+vnni") else 0
        assert all(any(isinstance(d, D.DotProduct) for d in s) and
                   all(d.offset == offset for d in s if isinstance(d, D.Pack) and d.group == 4)
                   for j in projections for s in j.schedules)


def test_directives_round_trip_through_the_results_file(tmp_path):
    all_kinds = [D.Split("i0", 6), D.Reorder("i0", "i1"), D.Unroll("i1", 2), D.UnrollJam("i0i", 4),
                 D.Vectorize("i1", 16), D.Pack("p2", 896, 64), D.Pack("p2", 896, 64, 4), D.Pack("p2", 896, 64, 4, 128),
                 D.DotProduct("j", 4), D.Parallel("i1")]
    assert store.parse_schedule(store.schedule_text(all_kinds)) == tuple(all_kinds)
    with pytest.raises(ValueError, match="not a schedule directive"):
        store.parse_directive("Explode(i0)")



@pytest.mark.parametrize("text, said", [
    ("{not json", "t.json: damaged tuning results"),
    ('{"format": 99, "kernels": {}}', "not a nanocompile tuning file"),
    ('{"format": 1, "kernels": {"k": {"use": ["Explode(i0)"], "digest": "d"}}}', "damaged tuning results"),
    ('{"format": 1, "kernels": {"k": {"use": ["Split(i0, 6)"]}}}', "damaged tuning results"),
    ('{"format": 1, "kernels": {"k": {"use": ["Pack(p2, 896, 64, 4, bogus=1)"], "digest": "d"}}}',
     "damaged tuning results"),
])
def test_damaged_results_file_is_ignored_with_a_note(tmp_path, capsys, text, said):
    """A damaged tuning file is never used: the recipes run (an empty table), and a note says why."""
    bad = tmp_path / "t.json"
    bad.write_text(text)
    assert store.tuned_table("x86-64-v3", bad) == ()
    assert said in capsys.readouterr().err


# the check before timing -------------------------------------------------------------------------

def _wrong(kernel, how):
    """The kernel with every store changed: its values doubled, or shifted one element back (the
    first lands in the guard region before the buffer)."""
    def fn(n):
        if isinstance(n, Store):
            if how == "value":
                return dataclasses.replace(n, value=Bin("*", n.value, FConst(2.0)))
            return dataclasses.replace(n, index=Bin("-", n.index, IConst(1)))
        return None
    return dataclasses.replace(kernel, body=rewrite(kernel.body, fn))


@pytest.mark.c
def test_the_harness_gives_a_sums_operand_its_activations_sums():
    """A schedule may read a matmul's xs operand instead of adding the bytes up (schedule/unsigned.py,
    on VNNI), so the harness's random data must hold there what the model holds: the sums of the
    int8 activations over each run. Checked on every CPU, not only where a schedule reads them."""
    jobs, march = model_jobs(CFG, precision="int8")
    job = next(j for j in jobs if j.kernel.sums)
    harness = KernelHarness(job.kernel, [], job.buffers, march, list(SHAPES))
    index = {p.name: i for i, p in enumerate(harness.params)}
    for activations, count, sums in job.kernel.sums:
        x, xs = harness.data[index[activations]], harness.data[index[sums]]
        runs = min(xs.size, x.size // count)
        assert runs > 0 and np.abs(xs[:runs]).max() > 0
        assert np.array_equal(xs[:runs], x[:runs * count].reshape(runs, count).sum(axis=1).astype(np.float32))


@pytest.mark.c
@pytest.mark.parametrize("precision, kind", [("f32", "projection"), ("int8", "int8 projection")])
def test_a_wrong_candidate_is_dropped_and_reported(precision, kind):
    jobs, march = model_jobs(CFG, precision=precision)
    job = next(j for j in jobs if j.klass == kind)
    good = apply(job.kernel, job.schedules[job.order[0]])
    candidates = [apply(job.kernel, job.schedules[job.recipe]), good,
                  _wrong(job.kernel, "value"), _wrong(job.kernel, "index")]
    harness = KernelHarness(job.kernel, candidates, job.buffers, march, list(SHAPES))
    measure = HarnessMeasure(harness, 0, threads=2)
    r = search([1, 2, 3], 0, measure, cost, lambda: False)
    by = {t.candidate: t for t in r.trials}
    assert by[1].outcome in ("won", "lost", "screened") and by[1].error is None
    assert by[2].outcome == "dropped" and "differs from the kernel as lowered" in by[2].error
    assert by[3].outcome == "dropped" and "written outside its buffer" in by[3].error
    assert r.winner in (0, 1)


# tuned schedules in a library --------------------------------------------------------------------

@pytest.mark.c
@pytest.mark.parametrize("precision, kind", [("f32", "projection"), ("int8", "int8 projection")])
def test_a_tuned_library_differs_in_code_not_in_one_bit(tmp_path, monkeypatch, precision, kind):
    monkeypatch.setenv("NANOCOMPILE_CACHE", str(tmp_path))
    jobs, march = model_jobs(CFG, precision=precision)
    job = max((j for j in jobs if j.klass == kind), key=lambda j: len(j.schedules))
    name = job.name.removesuffix(f" ({precision})")  # the kernel's own name in the module
    other = job.schedules[job.order[-1]]  # the grid point farthest from the recipe
    table = ((kernel_digest(job.kernel), other),)
    module = compile_model(CFG, precision=precision, tuned=table)
    assert module.tuned_kernels == [name] and module.kernels[name].schedule == other
    assert module.fingerprint_hash != compile_model(CFG, precision=precision).fingerprint_hash
    path = store.store_path(march)
    store.save(path, {"format": store.FORMAT, "kernels": {job.name: {"digest": table[0][0],
                                                                     "use": store.schedule_text(other)}}})
    assert store.tuned_table(march) == ((table[0][0], other, None),)  # no recipe recorded: no check
    weights = random_weights(CFG)
    ids = [5, 17, 42, 7, 99, 3]
    rows = {}
    for tuned in (True, False):
        s = CompiledSession.from_weights(CFG, weights, n_ctx=64, threads=2, tuned=tuned, precision=precision)
        assert s.module.tuned_kernels == ([name] if tuned else [])
        out = [s.step(ids, all_logits=True)] + [s.step([int(np.argmax(s.step([9])))])]
        rows[tuned] = np.concatenate([o.ravel() for o in out])
        s.close()
    assert np.array_equal(rows[True].view(np.uint32), rows[False].view(np.uint32))


@pytest.mark.slow
def test_a_schedule_measured_against_another_recipe_is_not_used():
    """A winner beat the recipe of its day: once the recipe has changed (or differs for this
    build, a 5-bit weight's), the measured schedule says nothing about it, so the recipe runs and
    the module lists the kernel as stale."""
    jobs, _ = model_jobs(CFG, precision="int8")
    job = max((j for j in jobs if j.klass == "int8 projection"), key=lambda j: len(j.schedules))
    name = job.name.removesuffix(" (int8)")
    other, recipe = job.schedules[job.order[-1]], job.schedules[job.recipe]
    older = job.schedules[job.order[0]]  # a recipe this kernel no longer has
    current = compile_model(CFG, precision="int8", tuned=((kernel_digest(job.kernel), other, recipe),))
    assert current.tuned_kernels == [name] and current.stale_tuned_kernels == []
    stale = compile_model(CFG, precision="int8", tuned=((kernel_digest(job.kernel), other, older),))
    assert stale.tuned_kernels == [] and stale.stale_tuned_kernels == [name]
    assert stale.kernels[name].schedule == recipe
    assert stale.fingerprint_hash == compile_model(CFG, precision="int8").fingerprint_hash


# the command ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune")
    path = write_gguf(d / "tiny.gguf", CFG, random_weights(CFG), quantize=False)
    return str(path), {**os.environ, "NANOCOMPILE_CACHE": str(d / "cache")}, d / "cache"


@pytest.mark.c
def test_tune_command_records_replayable_searches(tiny):
    path, env, cache = tiny
    budget = 20
    r = subprocess.run([*NC, "tune", "-q", "-m", path, "--budget", str(budget)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    files = list((cache / "tuned").glob("*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["cpu"] and data["march"] and data["run"]["peak_rss_mib"] > 0
    assert data["run"]["seconds"] < budget + 30  # the last kernel's compile may run over
    jobs, _ = model_jobs(CFG)
    assert set(data["kernels"]) == {j.name for j in jobs} and "stable" in r.stdout
    measured = 0
    for job in jobs:
        e = data["kernels"][job.name]
        assert len(e["searches"]) == 2
        for s in e["searches"]:
            rec = Result(s["winner"], [Trial.from_dict(t) for t in s["trials"]], s["tried"], s["complete"])
            again = replay(job.order, job.recipe, rec, cost)
            assert again.winner == rec.winner and [t.as_dict() for t in again.trials] == s["trials"]
            measured += sum(len(t["pairs"]) for t in s["trials"])
    assert measured > 0
    info = subprocess.run([*NC, "info"], capture_output=True, text=True, env=env, timeout=120)
    assert "tuned schedules" in info.stdout and str(files[0]) in info.stdout
    # int8's kernels join the same file under their own names; f32's results stay
    r = subprocess.run([*NC, "tune", "-q", "-m", path, "--precision", "int8", "--budget", "10"], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    both = json.loads(files[0].read_text())["kernels"]
    int8_jobs, _ = model_jobs(CFG, precision="int8")
    assert set(both) == {j.name for j in jobs} | {j.name for j in int8_jobs}
    assert all(both[j.name] == data["kernels"][j.name] for j in jobs)
    assert "int8 projection" in r.stdout and all(len(both[j.name]["searches"]) == 2 for j in int8_jobs)


def test_tune_refuses_an_unknown_precision_before_anything_loads(tiny, tmp_path):
    """As every command does: argparse names the flag, the value and the choices (exit status 2)."""
    path, env, _ = tiny
    env = {**env, "NANOCOMPILE_CACHE": str(tmp_path)}
    r = subprocess.run([*NC, "tune", "-q", "-m", path, "--precision", "int4", "--budget", "5"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == ("nanocompile tune: error: argument --precision: invalid choice: 'int4' "
                                                 "(choose from 'auto', 'f32', 'int8', 'native')")
    assert not (tmp_path / "tuned").exists()  # nothing measured, nothing written


@pytest.mark.c
def test_tune_can_be_interrupted_and_keeps_what_it_measured(tiny, tmp_path):
    path, env, _ = tiny
    env = {**env, "NANOCOMPILE_CACHE": str(tmp_path)}
    # Ctrl-C's default action in the child, whatever this suite inherited (a shell's background job
    # ignores SIGINT, and so would the child: Python installs no KeyboardInterrupt handler then)
    p = subprocess.Popen([*NC, "tune", "-q", "-m", path, "--budget", "300"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    files = []
    while time.monotonic() < deadline and p.poll() is None:
        files = list((tmp_path / "tuned").glob("*.json"))
        if files and any(e["searches"] for e in json.loads(files[0].read_text())["kernels"].values()):
            break
        time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted: what was measured is kept" in err and "Traceback" not in err
    data = json.loads(files[0].read_text())
    assert data["run"]["interrupted"] is True
    assert any(e["searches"] for e in data["kernels"].values())
