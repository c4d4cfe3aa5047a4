"""C generation: deterministic, templates fed plain data, strict about what they are given."""
import json
import os
import subprocess
import sys

import jinja2
import pytest
from bench.support.tiny import random_weights, tiny_config, write_gguf

from nanocompile.codegen.render import environment, render_tree, template_data
from nanocompile.codegen.tree import write_tree
from nanocompile.compiler.driver import STAGES, compile_model


@pytest.mark.slow
def test_generating_twice_gives_identical_files(tmp_path):
    a = render_tree(compile_model(tiny_config()))
    b = render_tree(compile_model(tiny_config()))
    assert a == b
    write_tree(compile_model(tiny_config()), tmp_path / "one")
    write_tree(compile_model(tiny_config()), tmp_path / "two")
    for f in sorted((tmp_path / "one").rglob("*")):
        if f.is_file():
            assert f.read_bytes() == (tmp_path / "two" / f.relative_to(tmp_path / "one")).read_bytes(), f


def test_templates_get_plain_data():
    data = template_data(compile_model(tiny_config()))
    json.dumps(data)  # only dicts, lists, strings and numbers: no live compiler objects


def test_templates_are_strict():
    env = environment()
    with pytest.raises(jinja2.UndefinedError):
        env.get_template("model.h.j2").render(prefix="x_")


@pytest.mark.slow
def test_generated_c_reads_as_written_by_hand():
    files = render_tree(compile_model(tiny_config()))
    c = files["model.c"]
    # a fused kernel: named for its work and shape, its loop IR above it, hoisted row values
    assert "static void rowreduce_sqrt_mul_seqx40(float *restrict p0, const float *restrict p1" in c
    assert " * kernel matmul2_exp_mul_seqx72(p0: f32 write, p1: f32 read, p2: f32 read, p3: f32 read)" in c
    assert "/* f32[seq, 40], " in c  # every arena buffer has its shape beside it
    assert "(S->cache_v[0], " in c   # the v projection stores straight into its sequence's cache
    # the batched step: a per-sequence call reads the rows of its sequence, from r0 on
    assert "static void forward_batch_chunk(" in c and " + r0 * 40, " in c
    assert files["model.h"].count("NC_API") >= 15
    assert json.loads(files["manifest.json"])["fingerprint"]["config"]["hidden_size"] == 40
    unfused = render_tree(compile_model(tiny_config(), fuse=False))["model.c"]
    assert "static void matmul_seqx40_k40(float *restrict p0, const float *restrict p1" in unfused
    assert "append_2xseqx10(S->cache_k[0]" in unfused


@pytest.mark.parametrize("stage", list(STAGES))
def test_dump_after_each_stage(stage):
    """--dump-after prints the graph after a graph stage and the loop IR after the others."""
    lines = []
    march = "x86-64-v2" if stage == "separate" else None  # the stage runs where the target has no FMA
    compile_model(tiny_config(), march=march, dump_after=stage, out=lines.append)
    text = "".join(lines)
    if stage == "separate":
        assert "fma(" not in text and "acc = (acc + (p" in text
    if stage in ("cse", "fold", "fusion"):
        assert text.startswith("graph qwen2_logits_last(seq, past) {") and "matmul" in text
    else:
        assert text.startswith("program qwen2_logits_last") and "kernel " in text and "call " in text
    if stage in ("schedule", "memory"):
        assert "schedule: " in text
    if stage == "memory":
        assert "memory plan last: " in text


@pytest.mark.slow
def test_dump_after_on_the_command_line(tmp_path):
    gguf = write_gguf(tmp_path / "tiny.gguf", tiny_config(), random_weights(tiny_config()), quantize=False)
    env = {**os.environ, "NANOCOMPILE_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "nanocompile", "compile", "-q", "-m", str(gguf), "--dump-after", "link"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "program qwen2_logits_all" in r.stdout and "reduce k in 0..40:" in r.stdout
    r = subprocess.run([sys.executable, "-m", "nanocompile.generate", "--default-arch", "--out", str(tmp_path / "g"),
                        "--dump-after", "fusion"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "graph qwen2_logits_none(seq, past) {" in r.stdout, r.stderr


def test_generate_without_weights_refuses_a_precision_that_needs_them(tmp_path):
    """--default-arch has no file to take native's blocks from: one line naming the way out, exit
    1, nothing written; auto (the default) is float32 there (the dump test above runs it)."""
    r = subprocess.run([sys.executable, "-m", "nanocompile.generate", "--default-arch", "--precision", "native",
                        "--out", str(tmp_path / "g")], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == ["nanocompile.generate: error: --default-arch has no weights: --precision "
                                             "native needs a model file (-m); without one choose f32 or int8"]
    assert not (tmp_path / "g").exists()


def test_the_command_line_lists_the_compilers_stages():
    from nanocompile.compiler import STAGE_NAMES

    assert tuple(STAGES) == STAGE_NAMES


def test_a_register_tiles_loop_of_dot_products_is_unrolled():
    """A constant loop of at most UNROLL_DOT_LOOPS steps that only adds dot products is unrolled
    (rolled, GCC kept accumulators on the stack); a loop doing anything else, a longer one and a
    symbolic one are left to the compiler."""
    from nanocompile.codegen.cexpr import UNROLL_DOT_LOOPS, dot_loop_unrolled
    from nanocompile.loopir.ir import Acc, AccUpdate, Bin, Dot, IConst, Load, Loop, Store, Var

    def dot(name):
        return AccUpdate(name, Dot(Acc(name), Load("p1", Bin("*", Var("j"), IConst(4))),
                                   Load("p2", Bin("*", Var("j"), IConst(32)))))

    tile = (dot("isum_0"), dot("isum_1"))
    assert dot_loop_unrolled(Loop("j", IConst(8), tile))
    assert dot_loop_unrolled(Loop("j", IConst(UNROLL_DOT_LOOPS), tile))
    assert not dot_loop_unrolled(Loop("j", IConst(UNROLL_DOT_LOOPS + 1), tile))
    assert not dot_loop_unrolled(Loop("j", IConst(1), tile))
    assert not dot_loop_unrolled(Loop("j", Var("seq"), tile))
    assert not dot_loop_unrolled(Loop("j", IConst(8), tile + (Store("p0", Var("j"), Acc("isum_0")),)))
    assert not dot_loop_unrolled(Loop("j", IConst(8), (Loop("t", IConst(2), tile),)))
    assert not dot_loop_unrolled(Loop("j", IConst(8), (AccUpdate("acc", Bin("+", Acc("acc"), Load("p1", Var("j")))),)))
