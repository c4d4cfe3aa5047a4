"""Graph IR: shape inference, the verifier and the printer, including what they refuse."""
import dataclasses

import numpy as np
import pytest

from nanocompile.ir import PAST, PRIMITIVES, SEQ, GraphBuilder, IRError, format_graph, verify


def test_primitive_count_and_documentation():
    # every primitive has a documented meaning
    from pathlib import Path
    assert len(PRIMITIVES) == 30
    doc = Path(__file__).parents[1] / "docs" / "PRIMITIVES.md"
    text = doc.read_text()
    for op in PRIMITIVES:
        assert f"`{op}`" in text, op


def test_symbolic_shapes_flow_through():
    b = GraphBuilder("t")
    cache = b.input("cache", [2, PAST, 8])
    new = b.input("new", [2, SEQ, 8])
    allk = b.concat([cache, new], 1)
    assert b.shape(allk) == (2, PAST + SEQ, 8)
    last = b.slice(new, 1, SEQ - 1, SEQ)
    assert b.shape(last) == (2, 1, 8)
    flat = b.reshape(b.permute(new, [1, 0, 2]), [SEQ, 16])
    assert b.shape(flat) == (SEQ, 16)
    s = b.matmul(new, b.permute(allk, [0, 2, 1]))
    assert b.shape(s) == (2, SEQ, PAST + SEQ)
    b.output("s", s)
    verify(b.finish())


@pytest.mark.parametrize("build, message", [
    (lambda b: b.add(b.input("a", [SEQ, 4]), b.input("b", [SEQ, 5])), "shapes differ"),
    (lambda b: b.add(b.input("a", [4]), b.input("b", [4], "i32")), "dtypes differ"),
    (lambda b: b.reshape(b.input("a", [SEQ, 4]), [SEQ, 5]), "elements"),
    (lambda b: b.broadcast(b.input("a", [3, 4]), [6, 4]), "cannot become"),
    (lambda b: b.broadcast(b.input("a", [4]), [2, 4]), "rank"),
    (lambda b: b.permute(b.input("a", [3, 4]), [0, 0]), "not a permutation"),
    (lambda b: b.matmul(b.input("a", [3, 4]), b.input("b", [5, 6])), "inner sizes"),
    (lambda b: b.matmul(b.input("a", [2, 3, 4]), b.input("b", [3, 4, 6])), "batch axes"),
    (lambda b: b.concat([b.input("a", [3, 4]), b.input("b", [3, 5])], 0), "differs"),
    (lambda b: b.gather(b.input("t", [10, 4]), b.input("i", [SEQ])), "index must be i32"),
    (lambda b: b.where(b.input("c", [4], "f32"), b.input("a", [4]), b.input("b", [4])), "must be bool"),
    (lambda b: b.sqrt(b.input("a", [4], "i32")), "not supported"),
    (lambda b: b.reduce_sum(b.input("a", [4]), 1), "out of range"),
    (lambda b: b.slice(b.input("a", [4]), 2, 0, 1), "out of range"),
    (lambda b: b.cast(b.input("a", [4]), "f64"), "unknown dtype"),
    (lambda b: b.block_matmul(b.input("x", [SEQ, 40], "i8"), b.input("xd", [SEQ, 1]), b.input("w", [8, 40], "i8"),
                              b.input("wd", [8, 1], "f16")), "multiple of 32"),
    (lambda b: b.block_matmul(b.input("x", [SEQ, 64], "i8"), b.input("xd", [SEQ, 2]), b.input("w", [8, 64], "i8"),
                              b.input("wd", [8, 2])), "wants i8, f32, i8, f16"),
    (lambda b: b.input("a", [4], "f64"), "unknown dtype"),
])
def test_inference_refuses_ill_formed_nodes(build, message):
    with pytest.raises(IRError, match=message):
        build(GraphBuilder("bad"))


def test_duplicate_names_are_refused():
    b = GraphBuilder("t")
    b.weight("w", [4])
    with pytest.raises(IRError, match="defined twice"):
        b.weight("w", [4])


def _small_graph():
    b = GraphBuilder("t")
    x = b.input("x", [SEQ, 4])
    y = b.exp(x)
    b.output("y", b.add(x, y))
    return b.finish()


def test_verifier_catches_a_corrupted_graph():
    g = _small_graph()
    verify(g)
    # a recorded shape that inference disagrees with
    bad = dataclasses.replace(g.nodes[1], shape=(SEQ, 5))
    g.nodes[1] = bad
    with pytest.raises(IRError, match="inference gives"):
        verify(g)
    g = _small_graph()
    g.nodes[2] = dataclasses.replace(g.nodes[2], args=(0, 2))  # uses itself
    with pytest.raises(IRError, match="not defined before use"):
        verify(g)
    g = _small_graph()
    g.outputs["z"] = 99
    with pytest.raises(IRError, match="undefined"):
        verify(g)


def test_printer_is_readable_and_deterministic():
    b = GraphBuilder("t")
    x = b.input("x", [SEQ, 4])
    c = b.const(np.arange(4, dtype=np.float32))
    y = b.add(x, b.broadcast(b.reshape(c, [1, 4]), [SEQ, 4]))
    b.output("y", b.slice(y, 0, SEQ - 1, SEQ))
    g = b.finish()
    text = format_graph(g)
    assert 'input "x" : f32[seq, 4]' in text
    assert "slice %4 axis=0 [seq - 1 : seq] : f32[1, 4]" in text
    assert "<4 values, sha256" in text
    assert text == format_graph(g)
