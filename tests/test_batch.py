"""The batched step (issue 28, point 1): rows of several sequences in one pass over the weights, each
sequence with its own KV cache (a slot of the library) and its own position.

What it means is the interpreter's step_batch: every sequence's rows run as its own step. The
compiled library runs the per-sequence calls (RoPE's tables, the cache writes, attention) once per
sequence and everything else once over all rows (loopir/segments.py), so each sequence's logits and
cache come out bitwise as its own steps give them: tested against separate sessions stepping alone
and against the interpreter in the library's order, at every precision, vector level and thread
count, with sequences of different lengths, one finishing mid-batch and one joining mid-batch.
"""
import dataclasses

import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config
from helpers import THREADS, real_prompt_ids

from nanocompile.compiler.driver import compile_model
from nanocompile.engine.compiled import CompiledSession
from nanocompile.engine.interpreted import InterpreterSession, library_order
from nanocompile.errors import ContextFullError, InputError
from nanocompile.loopir.segments import BatchError, per_sequence, segment_groups

TINY = {
    "gqa2": dict(),
    "gqa3-odd-tied": dict(hidden=45, heads=3, kv_heads=1, head_dim=14, ffn=97, layers=3, vocab=211, tied=True),
    "gqa7-odd": dict(hidden=70, heads=7, kv_heads=1, head_dim=10, ffn=131, layers=2, vocab=301),
}


def schedule(rng, vocab: int) -> list[list[tuple[int, list[int]]]]:
    """Batched steps over four sequences: prompts of 5, 1 and 9 tokens together; then decoding,
    with sequence 3 joining at the third step with a prompt of 4 rows beside the others' one row,
    sequence 1 finishing after the fourth, and a step of 3 rows (a verified draft) in sequence 0."""
    def ids(n):
        return [int(t) for t in rng.integers(0, vocab, n)]

    steps = [[(0, ids(5)), (1, ids(1)), (2, ids(9))], [(0, ids(1)), (1, ids(1)), (2, ids(1))],
             [(2, ids(1)), (3, ids(4)), (0, ids(1)), (1, ids(1))], [(1, ids(1)), (0, ids(3)), (3, ids(1)), (2, ids(1))]]
    steps += [[(0, ids(1)), (2, ids(1)), (3, ids(1))] for _ in range(3)]
    # every row's logits, or the last row's alone (a prompt chunk's), by turns
    return [[(i, x, (k + j) % 2 == 0) for j, (i, x) in enumerate(step)] for k, step in enumerate(steps)]


def run_batched(sessions, steps):
    return [sessions[0].step_batch([(sessions[i], ids, every) for i, ids, every in step]) for step in steps]


def run_alone(sessions, steps):
    return [[sessions[i].step(ids, all_logits=every) for i, ids, every in step] for step in steps]


def assert_same(got, want, sessions_a, sessions_b, layers: int):
    for step_a, step_b in zip(got, want):
        for a, b in zip(step_a, step_b):
            assert a.shape == b.shape and np.array_equal(a, b)
    for a, b in zip(sessions_a, sessions_b):
        assert a.past == b.past and a.tokens == b.tokens
        for layer in range(layers):
            for x, y in zip(a.read_cache(layer), b.read_cache(layer)):
                assert np.array_equal(x, y)


@pytest.mark.parametrize("precision", ["f32", "int8"])
def test_groups_hold_every_per_sequence_call_and_share_only_rows(precision):
    """On a tiny Qwen2: every call that reads past or touches state lies in a group; a buffer a
    group shares with the calls around it is stored row by row (the group's own buffers get a
    place per sequence, so its calls run all sequences at once in the "all" variant's plan)."""
    module = compile_model(tiny_config(**TINY["gqa7-odd"]), precision)
    prog = module.variants["all"]
    groups = module.batch_groups
    assert groups == segment_groups(prog) and groups
    inside = {i for first, last in groups for i in range(first, last + 1)}
    per_seq = {i for i in range(len(prog.calls)) if per_sequence(prog, i)}
    assert per_seq <= inside and len(per_seq) >= 3 * module.signature.config["num_hidden_layers"]
    for first, last in groups:
        mine = {a for c in prog.calls[first:last + 1] for a in c.args}
        around = {a for c in prog.calls[:first] + prog.calls[last + 1:] for a in c.args}
        for name in mine & around:
            b = prog.buffers[name]
            assert b.kind in ("weight", "const", "state") or b.row_size > 0, name
    assert module.batch_plan is module.plans["all"]


def test_a_group_sharing_an_output_not_stored_by_rows_is_refused():
    """Groups grow over the calls that share their [heads, seq, d] buffers, so what can stop a
    batched step is an input or output not stored row by row that a group shares with the rest:
    segment_groups refuses such a program, naming the buffer (here the logits, made to look so)."""
    prog = compile_model(tiny_config(), "f32").variants["all"]
    out = next(n for n, b in prog.buffers.items() if b.kind == "output")
    prog.buffers[out] = dataclasses.replace(prog.buffers[out], row_size=0)
    first, _ = segment_groups(prog)[0]
    prog.calls[first].args = tuple(prog.calls[first].args) + (out,)
    with pytest.raises(BatchError, match=f"share {out} .* not stored row by row"):
        segment_groups(prog)


@pytest.mark.c
@pytest.mark.levels
@pytest.mark.parametrize("precision", ["f32", "int8", "native"])
@pytest.mark.parametrize("name", sorted(TINY))
def test_batched_step_is_each_sequence_alone(name, precision):
    """Four sequences of different lengths, batched, against the same sequences stepping alone in
    another instance of the library and against the interpreter's step_batch in the library's
    order: every row's logits, every cache, bit for bit; at 1, 2, 3 and 8 threads."""
    cfg = tiny_config(**TINY[name])
    w = random_weights(cfg, seed=len(name))
    batched = CompiledSession.from_weights(cfg, w, n_ctx=64, threads=2, precision=precision)
    alone = CompiledSession.from_weights(cfg, w, n_ctx=64, threads=1, precision=precision)
    a, b = batched.sequences(4), alone.sequences(4)
    reference = InterpreterSession.from_weights(cfg, w, n_ctx=64, precision=precision, order=library_order())
    r = reference.sequences(4)
    for threads in THREADS:
        batched.set_threads(threads)
        for s in a + b + r:
            s.reset()
        steps = schedule(np.random.default_rng(threads), cfg.vocab_size)
        got = run_batched(a, steps)
        assert_same(got, run_alone(b, steps), a, b, cfg.num_hidden_layers)
        want = run_batched(r, steps)
        for step_a, step_r in zip(got, want):
            assert all(np.array_equal(x, y) for x, y in zip(step_a, step_r))
    batched.close()
    alone.close()


@pytest.mark.c
def test_batched_step_refuses_bad_input_and_changes_nothing():
    cfg = tiny_config()
    w = random_weights(cfg, seed=3)
    session = CompiledSession.from_weights(cfg, w, n_ctx=16, threads=2, precision="int8")
    s = session.sequences(3)
    s[0].step([1, 2, 3])
    s[1].step([4] * 14)
    pasts = [x.past for x in s]
    cases = [([(s[0], [5]), (s[0], [6])], InputError, "twice"),
             ([(s[0], [cfg.vocab_size])], InputError, "outside"),
             ([(s[0], [5]), (s[1], [6, 7, 8])], ContextFullError, "context is full"),
             ([(s[0], [1] * 97)], InputError, "at most 96"),
             ([], InputError, "no sequences")]
    for parts, error, words in cases:
        with pytest.raises(error, match=words):
            session.step_batch(parts)
        assert [x.past for x in s] == pasts
    # the library's own checks, past Python's: a slot given twice, rows < 1
    lib, h = session.lib, session._handle
    ids, out = np.array([1, 2], np.int32), np.empty((2, cfg.vocab_size), np.float32)
    for slots, rows in (([0, 0], [1, 1]), ([0, 5], [1, 1]), ([0, 1], [2, 0])):
        slots, rows = np.array(slots, np.int32), np.array(rows, np.int32)
        assert lib.step_batch(h, 2, slots.ctypes.data, rows.ctypes.data, None, ids.ctypes.data, out.ctypes.data) == 1
        assert [x.past for x in s] == pasts
    with pytest.raises(InputError, match="outside 1..96"):
        session.sequences(0)
    with pytest.raises(InputError, match="opened the library"):
        s[1].sequences(2)
    # a step of the remaining sequences still gives what they give alone
    alone = CompiledSession.from_weights(cfg, w, n_ctx=16, threads=1, precision="int8").sequences(2)
    alone[0].step([1, 2, 3])
    got = session.step_batch([(s[0], [9]), (s[2], [8, 7])])
    assert np.array_equal(got[0], alone[0].step([9], all_logits=True))
    assert np.array_equal(got[1], alone[1].step([8, 7], all_logits=True))


@pytest.mark.model
def test_real_model_batched_decoding_is_each_sequence_alone(real_model):
    """The default model at its default precision: three prompts, then batched decoding with a
    sequence joining late: logits and caches bitwise those of the same sequences run alone."""
    from nanocompile.engine.open import open_session

    native = open_session(real_model, "compiled", n_ctx=256, threads=2, precision="auto")
    other = open_session(real_model, "compiled", n_ctx=256, threads=2, precision="auto")
    a, b = native.sequences(4), other.sequences(4)
    prompts = [real_prompt_ids(real_model, p) for p in ("code", "english", "chat")]
    steps = [[(0, prompts[0], False), (1, prompts[1], True)], [(0, [262], True), (1, [13], False), (2, prompts[2], False)],
             [(0, [264], False), (1, [11], True), (2, [198], True), (3, [40, 41], True)],
             [(2, [25], False), (3, [42], True), (0, [220], True)]]
    assert_same(run_batched(a, steps), run_alone(b, steps), a, b, real_model.config.num_hidden_layers)
    native.close()
    other.close()
