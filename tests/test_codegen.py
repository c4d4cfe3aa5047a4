"""C generation: deterministic, templates fed plain data, strict about what they are given."""
import json

import jinja2
import pytest

from nanocompile.codegen.render import environment, render_tree, template_data
from nanocompile.compiler import compile_model
from nanocompile.generate import write_tree

from model_files import tiny_config


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


def test_generated_c_reads_as_written_by_hand():
    files = render_tree(compile_model(tiny_config()))
    c = files["model.c"]
    # a fused kernel: named for its work and shape, its loop IR above it, hoisted row values
    assert "static void rowreduce_sqrt_mul_seqx40(float *restrict p0, const float *restrict p1" in c
    assert " * kernel matmul2_exp_mul_seqx72(p0: f32 write, p1: f32 read, p2: f32 read, p3: f32 read)" in c
    assert "/* f32[seq, 40], " in c  # every arena buffer has its shape beside it
    assert "(m->cache_v[0], " in c   # the v projection stores straight into the cache
    assert files["model.h"].count("NC_API") >= 15
    assert json.loads(files["manifest.json"])["fingerprint"]["config"]["hidden_size"] == 40
    unfused = render_tree(compile_model(tiny_config(), fuse=False))["model.c"]
    assert "static void matmul_seqx40_k40(float *restrict p0, const float *restrict p1" in unfused
    assert "append_kv_2xseqx10(m->cache_k[0]" in unfused
