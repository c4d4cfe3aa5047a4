"""int8 on the real default model: the weights are llama.cpp's Q8_0 numbers, the shipped int8
library is bitwise equal to its unfused, unscheduled build, and its greedy tokens are the int8
interpreter's."""
from pathlib import Path

import numpy as np
import pytest
from helpers import greedy_run, real_prompt_ids

from nanocompile.engine.compiled import CompiledSession
from nanocompile.engine.interpreted import InterpreterSession, library_order
from nanocompile.engine.open import weight_form
from nanocompile.models.gguf_model import GGUFModel
from nanocompile.models.quantize import split_q8_0
from nanocompile.models.weights import WeightSource
from bench.support.peer import requantized

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def int8_weights(real_model):
    """Every int8 weight, made once (Q8_0 tensors split as stored, the rest quantized)."""
    return dict(weight_form("int8", real_model.weights))


@pytest.fixture(scope="module")
def int8_compiled(real_model, int8_weights):
    return CompiledSession.from_weights(real_model.config, int8_weights, n_ctx=512, threads=2, weights_key=real_model.key,
                           precision="int8")


def test_int8_weights_are_llama_cpp_q8_0(real_model, int8_weights, tmp_path_factory):
    """llama.cpp writes a Q8_0 GGUF from the same file (llama_model_quantize, allow_requantize):
    its Q8_0 tensors against ours, value by value and scale by scale. Ours: Q8_0 tensors split
    as stored, the others dequantized by the gguf library and quantized by its Q8_0 quantizer,
    which is ggml's reference quantizer."""
    q8_path = requantized(Path(real_model.source), "q8_0", tmp_path_factory.mktemp("llama"))
    gguf = GGUFModel(q8_path)
    theirs = {name: gguf.raw(name)[1] for name, t in gguf.tensors.items() if t.type == "Q8_0"}
    values = scales = differing_values = differing_scales = 0
    for name, raw in theirs.items():
        qs, d = split_q8_0(raw, *real_model.weights.shapes[name])
        values, scales = values + qs.size, scales + d.size
        differing_values += int((qs != int8_weights[name + ".qs"]).sum())
        differing_scales += int((d.view(np.uint16) != int8_weights[name + ".d"].view(np.uint16)).sum())
    print(f"{len(theirs)} tensors, {values} int8 values and {scales} scales: {differing_values} values and "
          f"{differing_scales} scales differ")
    assert len(theirs) == 24 * 7 + 2  # every projection, the embedding and the output head
    assert differing_values == 0 and differing_scales == 0


def test_real_int8_library_is_bitwise_its_unscheduled_build(real_model, int8_weights, int8_compiled):
    """The shipped int8 library (fused, scheduled: VNNI or AVX2 dot products, packed weights, 2
    threads) against the unfused, unscheduled int8 build: prompt, two steps and the KV cache."""
    ids = real_prompt_ids(real_model, "code")
    plain = CompiledSession.from_weights(real_model.config, int8_weights, n_ctx=64, weights_key=real_model.key,
                            precision="int8", fuse=False, schedule=False)
    for s in (int8_compiled, plain):
        s.reset()
    assert np.array_equal(int8_compiled.step(ids, all_logits=True), plain.step(ids, all_logits=True))
    for t in (13, 999):
        assert np.array_equal(int8_compiled.step([t]), plain.step([t]))
    for layer in (0, 11, 23):
        for a, b in zip(int8_compiled.read_cache(layer), plain.read_cache(layer)):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("name", ["code", "english", "chat"])
def test_real_int8_model_is_bitwise_the_int8_interpreter(real_model, int8_weights, int8_compiled, name):
    """The int8 interpreter adds its float32 parts (attention, norms) in the generated code's
    order (fused multiply-adds in the matmuls where the target has them), exp as nc_expf and the C library's sinf, cosf: the compiled int8 model gives the same
    logits bit for bit at every step, so the same greedy tokens. (In NumPy's order, activation
    quantization turns float32 rounding differences into other int8 values: on the code prompt
    the logits differed by up to 0.31 and a near tie flipped a token at step 14.)"""
    interp = InterpreterSession.from_weights(real_model.config, int8_weights, n_ctx=128, precision="int8")
    assert interp.order == library_order()  # "compiled_fma" where the target has FMA
    ids = real_prompt_ids(real_model, name)
    want = greedy_run(interp, ids, 16)
    got = greedy_run(int8_compiled, ids, 16)
    assert got["tokens"] == want["tokens"]
    assert np.array_equal(got["prompt_logits"], want["prompt_logits"])
    assert all(np.array_equal(a, b) for a, b in zip(got["step_logits"], want["step_logits"]))


def test_q8_0_tensors_are_read_as_stored(real_model):
    """The default file's Q8_0 tensors (the output head, some v projections) reach the int8
    weights as stored, without a float32 round trip: the float32 conversion is never asked for."""
    source = real_model.weights
    stored = [name for name in source if len(source.shapes[name]) == 2 and source.raw(name)[0] == "Q8_0"]
    assert "lm_head.weight" in stored and len(stored) == 13

    def refuse(name):
        raise AssertionError(f"{name} was converted to float32")

    weights = weight_form("int8", WeightSource(source.shapes, refuse, "the default model", raw=source.raw))
    _, raw = source.raw("lm_head.weight")
    qs, d = split_q8_0(raw, *source.shapes["lm_head.weight"])
    assert np.array_equal(weights["lm_head.weight.qs"], qs) and np.array_equal(weights["lm_head.weight.d"], d)
