"""The block formats described as data (nanocompile/formats.py) against the two references that
define them: the `gguf` library's dequantization (NumPy, what the loader converts with) and
ggml's own C (dequantize_row_* and quantize_row_*_ref from llama-cpp-python's libggml-base),
bitwise, on random blocks, on blocks quantized from Gaussian data, on extreme blocks, and on
every tensor of the default model."""
from __future__ import annotations

import ast
import dataclasses
import itertools
from fractions import Fraction
from pathlib import Path

import gguf
import numpy as np
import pytest
from bench.support.peer import ggml_base, ggml_dequantize, ggml_quantize
from bench.support.tiny import random_weights, tiny_config, write_gguf, write_hf_dir

from nanocompile.errors import ModelError
from nanocompile.models import formats, load_model
from nanocompile.models.formats import (FORMATS, BitPart, BlockFormat, FormatDescriptionError, ScaleRule, Unpacked,
                                        check_finite_scales, dequantize, format_named, format_of, pack, unpack)
from nanocompile.models.gguf_file import read_gguf


def gguf_dequantizes(fmt: BlockFormat) -> bool:
    try:
        gguf.quants.dequantize(np.zeros((1, fmt.nbytes), np.uint8), gguf.GGMLQuantizationType(fmt.ggml_type))
    except NotImplementedError:
        return False
    return True


def gguf_quantizes(fmt: BlockFormat) -> bool:
    try:
        gguf.quants.quantize(np.zeros((1, fmt.block), np.float32), gguf.GGMLQuantizationType(fmt.ggml_type))
    except NotImplementedError:
        return False
    return True


ALL = list(FORMATS.values())
IDS = [f.name for f in ALL]
GGUF_READS = [f for f in ALL if gguf_dequantizes(f)]
needs_ggml = pytest.mark.skipif(ggml_base() is None, reason="ggml's C reference comes with llama-cpp-python "
                                                            "(pip install '.[test]'), which is not installed")


def bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float32).ravel(), np.asarray(b, np.float32).ravel()
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def gguf_dequantize(fmt: BlockFormat, raw: np.ndarray) -> np.ndarray:
    """raw: [n_blocks, nbytes], or [rows, blocks per row, nbytes] (given to gguf as rows: it
    works on 16 rows at a time, so a block per row would take 6x longer)."""
    rows = np.asarray(raw).reshape(raw.shape[0], -1)
    return gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(fmt.ggml_type))


# --- blocks to test on ---------------------------------------------------------------------

FLOAT_BITS = {"f16": (np.uint16, np.float16, 0x4000), "f32": (np.uint32, np.float32, 0x40000000)}


def random_floats(dtype: str, shape, rng) -> np.ndarray:
    """Uniform over the finite bit patterns' exponents: subnormals, zeros and +-65504 included
    (a non-finite pattern loses its top exponent bit)."""
    uint, flt, top_exponent_bit = FLOAT_BITS[dtype]
    bits = rng.integers(0, np.iinfo(uint).max, shape, dtype=uint, endpoint=True)
    bits = np.where(np.isfinite(bits.view(flt)), bits, bits & ~uint(top_exponent_bit)).astype(uint)
    return bits.view(flt)


def random_blocks(fmt: BlockFormat, n: int, seed: int = 0) -> np.ndarray:
    """Random bytes, with random finite float scales."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, fmt.nbytes), dtype=np.uint8)
    for f in fmt.fields:
        if f.dtype in FLOAT_BITS:
            raw[:, f.offset:f.offset + f.nbytes] = random_floats(f.dtype, (n, f.count), rng).view(np.uint8)
    return raw


def gaussian_weights(fmt: BlockFormat, rows: int = 64, blocks_per_row: int = 8, seed: int = 0) -> np.ndarray:
    """Rows of normal weights at row scales from 1e-3 to 1, a few outliers, and one row of zeros."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, blocks_per_row * fmt.block)).astype(np.float32)
    w *= np.logspace(-3, 0, rows, dtype=np.float32)[:, None]
    outliers = rng.random(w.shape) < 0.002
    w[outliers] *= 20
    w[0] = 0
    return w


def quantized_blocks(fmt: BlockFormat, seed: int = 0) -> tuple[np.ndarray, str]:
    """Gaussian weights quantized by the gguf library if it quantizes this type, else by ggml's
    C reference quantizer (skipped if that is not installed)."""
    w = gaussian_weights(fmt, seed=seed)
    if gguf_quantizes(fmt):
        raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType(fmt.ggml_type))
        return raw.reshape(-1, fmt.nbytes), "gguf"
    if ggml_base() is None:
        pytest.skip(f"gguf cannot quantize {fmt.name} and ggml's C reference (llama-cpp-python) is not installed")
    return ggml_quantize(fmt.name, w, fmt.nbytes, fmt.block), "ggml"


F16_EXTREMES = np.array([0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x03FF, 0x0400, 0x0000, 0x8000, 0x3C00],
                        np.uint16).view(np.float16)  # +-65504, +-smallest subnormal, largest subnormal,
#                                                      smallest normal, +-0, 1
F32_EXTREMES = np.array([0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0, 0x80000000,
                         0x3F800000], np.uint32).view(np.float32)


def quant_patterns(fmt: BlockFormat) -> list[np.ndarray]:
    """All quants at their minimum, all at their maximum, and alternating."""
    low, high = (-128, 127) if fmt.signed else (0, (1 << fmt.bits) - 1)
    alternating = np.where(np.arange(fmt.block) % 2, high, low)
    return [np.full(fmt.block, low), np.full(fmt.block, high), alternating]


def sub_patterns(fmt: BlockFormat, rule: ScaleRule | None) -> list[np.ndarray]:
    if rule is None:
        return [None]
    if not rule.sub:
        return [np.ones(fmt.n_sub, np.int16)]
    k = formats.sub_range(rule)
    return [np.full(fmt.n_sub, k[0]), np.full(fmt.n_sub, k[-1]), np.where(np.arange(fmt.n_sub) % 2, k[-1], k[0])]


def extreme_blocks(fmt: BlockFormat) -> np.ndarray:
    """Every combination of quant pattern, super-scales from EXTREMES and sub-scales at the ends
    of their range, written by pack."""
    value_fields = [f for f in fmt.fields if f.dtype != "u8"]
    value_choices = [F16_EXTREMES if f.dtype == "f16" else F32_EXTREMES if f.dtype == "f32" else [0]
                     for f in value_fields]
    combos = list(itertools.product(quant_patterns(fmt), sub_patterns(fmt, fmt.scale), sub_patterns(fmt, fmt.min),
                                    *value_choices))
    q = np.stack([c[0] for c in combos])
    u = Unpacked(q=q.astype(np.int8) if fmt.signed else q.astype(np.uint8), scale=None, min=None,
                 sub_scale=np.stack([c[1] for c in combos]).astype(np.int16),
                 sub_min=None if fmt.min is None else np.stack([c[2] for c in combos]).astype(np.int16),
                 values={f.name: np.array([[c[3 + i]] * f.count for c in combos], formats.VALUE_DTYPES[f.dtype])
                         for i, f in enumerate(value_fields)})
    return pack(fmt, u)


KINDS = ["random", "quantized", "extreme"]


def blocks_of(kind: str, fmt: BlockFormat) -> np.ndarray:
    if kind == "random":
        return random_blocks(fmt, 2000)
    if kind == "quantized":
        return quantized_blocks(fmt)[0]
    return extreme_blocks(fmt)


# --- the descriptions ----------------------------------------------------------------------

def test_formats_are_ggml_types():
    """Each description's type id, name, block and bytes are ggml's (gguf's tables); every other
    type has no description."""
    assert {f.name for f in ALL} >= {"Q8_0", "Q4_0", "Q5_0", "Q4_1", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q8_K"}
    for qtype in gguf.GGMLQuantizationType:
        fmt = format_of(qtype.value)
        if fmt is None:
            assert format_named(qtype.name) is None
            continue
        assert (fmt.name, fmt.block, fmt.nbytes) == (qtype.name, *gguf.GGML_QUANT_SIZES[qtype])
        assert format_named(qtype.name) is fmt
    assert format_of(0) is None and format_of(9999) is None  # F32, and no type at all


def test_gguf_reads_every_format_but_q8_k():
    """Q8_K is the K formats' activation type: gguf has no dequantizer for it, so ggml's C is its
    reference (test_matches_ggml_c)."""
    assert [f.name for f in ALL if f not in GGUF_READS] == ["Q8_K"]


def test_formats_module_imports_only_numpy():
    tree = ast.parse(Path(formats.__file__).read_text())
    imported = {n.module if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    assert imported <= {"__future__", "dataclasses", "functools", "numpy", "errors"}, imported


@pytest.mark.parametrize("fmt", [f for f in ALL if f.scale.sub], ids=lambda f: f.name)
def test_scale_products_are_exact(fmt):
    """scale[s] = float32(d) * k_s (and min) is exact: for every finite float16 d and every k the
    rule allows, the float32 product equals the float64 one."""
    d = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    d = d[np.isfinite(d)].astype(np.float32)
    for rule in (fmt.scale, fmt.min):
        if rule is None:
            continue
        for k in formats.sub_range(rule):
            assert np.array_equal(d * np.float32(k), d.astype(np.float64) * k), (fmt.name, rule.super, k)


def broken(fmt: BlockFormat, **changes) -> BlockFormat:
    return dataclasses.replace(fmt, **changes)


@pytest.mark.parametrize("fmt, expected", [
    (broken(formats.Q4_0, quant=formats.Q4_0.quant[:1] * 32), "used twice"),
    (broken(formats.Q4_0, quant=tuple((BitPart("qs", j % 16, 0, 4),) for j in range(32))), "used twice"),
    (broken(formats.Q4_0, bits=5), "do not make a 5-bit integer"),
    (broken(formats.Q8_0, quant=tuple((BitPart("qs", j, 0, 4),) for j in range(32))), "do not make"),
    (broken(formats.Q4_0, quant=tuple((BitPart("qs", 16 + j, 0, 4),) for j in range(32))), "outside a u8 field"),
    (broken(formats.Q4_0, nbytes=19), "do not tile"),
    (broken(formats.Q4_K, scale=dataclasses.replace(formats.Q4_K.scale, bits=14,
                                                    sub=tuple((BitPart("scales", 0, 0, 8), BitPart("scales", 1, 0, 6, 8))
                                                              for _ in range(8)))), "14-bit integers"),
    (broken(formats.Q8_K, scale=ScaleRule("d", ((BitPart("qs", 0, 0, 8),),), bits=8)),  # float32 d * k
     "not exact in float32"),
    (broken(formats.Q4_K, scale=dataclasses.replace(formats.Q4_K.scale, sub=formats.Q4_K.scale.sub[:4])),
     "4 sub-scales for 8"),
])
def test_a_description_that_contradicts_itself_is_refused(fmt, expected):
    with pytest.raises(FormatDescriptionError, match=expected):
        formats.tables(fmt)


# --- against gguf and ggml ---------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", GGUF_READS, ids=lambda f: f.name)
def test_matches_gguf(fmt, kind):
    raw = blocks_of(kind, fmt)
    assert bitwise_equal(dequantize(fmt, raw), gguf_dequantize(fmt, raw))


@needs_ggml
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_matches_ggml_c(fmt, kind):
    """The C that llama.cpp runs (as built in llama-cpp-python's wheel)."""
    raw = blocks_of(kind, fmt)
    assert bitwise_equal(dequantize(fmt, raw), ggml_dequantize(fmt.name, raw, fmt.block))


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_quantized_blocks_are_close_to_their_weights(fmt):
    """Not a tautology check of the layouts: ggml's quantizers put each weight near its value,
    so reading a block with a wrong layout would land far off."""
    w = gaussian_weights(fmt)
    raw, _ = quantized_blocks(fmt)
    got = dequantize(fmt, raw).reshape(w.shape)
    error = np.abs(got - w).max(axis=1) / np.maximum(np.abs(w).max(axis=1), 1e-30)
    assert error.max() < 2.0 ** -(fmt.bits - 2)


def test_k_format_sub_scales_are_ggmls():
    """Q4_K/Q5_K's 6-bit scales and mins, compared with gguf's own unpacking of them."""
    for fmt in (formats.Q4_K, formats.Q5_K):
        raw = random_blocks(fmt, 500)
        sc, m = gguf.quants.Q4_K.get_scale_min(raw[:, 4:16])
        u = unpack(fmt, raw)
        assert np.array_equal(u.sub_scale, sc) and np.array_equal(u.sub_min, m)
        assert np.array_equal(u.values["d"][:, 0], raw[:, 0:2].copy().view(np.float16)[:, 0])


@needs_ggml
def test_q8_k_block_sums_are_ggmls():
    """Q8_K's bsums field, written by ggml's quantizer, holds the sums of each 16 quants."""
    raw, _ = quantized_blocks(formats.Q8_K)
    u = unpack(formats.Q8_K, raw)
    sums = u.q.astype(np.int32).reshape(-1, 16, 16).sum(axis=2)
    assert np.array_equal(u.values["bsums"], sums)


FLOAT32_OVERFLOW = Fraction(2 ** 128 - 2 ** 103)  # float32's largest plus half its last step: rounds to inf


def nearest_float32(x: Fraction) -> np.float32:
    """The float32 nearest x, ties to even, decided exactly (float(x) then float32 may round twice)."""
    if abs(x) >= FLOAT32_OVERFLOW:
        return np.float32(np.inf if x > 0 else -np.inf)
    with np.errstate(over="ignore"):
        guess = np.float32(float(x))
    candidates = [c for c in (np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf)))
                  if np.isfinite(c)]
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - x), int(np.array(c).view(np.uint32)) & 1))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_every_weight_is_its_exact_value_rounded_once(fmt, kind):
    """An oracle that is neither gguf nor ggml: w_j is the float32 nearest the exact real
    sign * super * k_s * (q_j - offset) - sign * super_min * m_s (computed in fractions), so any
    kernel that rounds once (an FMA, or an exact product then a subtraction) agrees bit for bit.
    (The product is exact in float32 for every format but Q8_K: product_is_exact.)"""
    raw = blocks_of(kind, fmt)
    got = dequantize(fmt, raw).reshape(-1, fmt.block)
    u = unpack(fmt, raw)
    rng = np.random.default_rng(2)
    for b, j in zip(rng.integers(0, len(raw), 1500), rng.integers(0, fmt.block, 1500)):
        s = j // fmt.sub

        def factor(rule, k):
            sign = -1 if rule.negate else 1
            return sign * Fraction(float(u.values[rule.super][b, 0])) * int(k[b, s])

        exact = factor(fmt.scale, u.sub_scale) * (int(u.q[b, j]) - fmt.offset)
        if fmt.min is not None:
            exact -= factor(fmt.min, u.sub_min)
        if exact == 0:  # the sign of a zero follows IEEE rules the bitwise tests above cover
            assert got[b, j] == 0, (b, j)
        else:
            assert bitwise_equal(got[b, j], nearest_float32(exact)), (b, j, exact)
    assert formats.product_is_exact(fmt) == (fmt.name != "Q8_K")


# --- pack, and the finite check ------------------------------------------------------------

@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_unpack_pack_round_trips_bytes(fmt):
    """Every byte pattern (NaN and infinite scales too) survives unpack then pack."""
    raw = np.random.default_rng(1).integers(0, 256, (3000, fmt.nbytes), dtype=np.uint8)
    u = unpack(fmt, raw)
    assert u.q.shape == (3000, fmt.block) and u.q.dtype == (np.int8 if fmt.signed else np.uint8)
    assert u.scale.shape == (3000, fmt.n_sub) and u.scale.dtype == np.float32
    assert (u.min is None) == (not fmt.has_min)
    assert np.array_equal(pack(fmt, u), raw)
    assert np.array_equal(pack(fmt, unpack(fmt, raw[:, None, :][7:9])), raw[7:9])  # leading axes are blocks


def test_pack_refuses_quants_out_of_range():
    u = unpack(formats.Q4_0, random_blocks(formats.Q4_0, 2))
    u.q = u.q + np.uint8(16)
    with pytest.raises(ValueError, match=r"Q4_0 quants must be in \[0, 15\]"):
        pack(formats.Q4_0, u)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_check_finite_scales_names_the_tensor_and_block(fmt, bad):
    raw = random_blocks(fmt, 12).reshape(3, 4, fmt.nbytes)
    check_finite_scales(fmt, raw, "'blk.0.ffn_up.weight'")  # finite: no error
    for f in fmt.fields:
        if f.dtype not in FLOAT_BITS:
            continue
        broken_raw = raw.copy()
        broken_raw[2, 1, f.offset:f.offset + f.nbytes] = np.array([bad], FLOAT_BITS[f.dtype][1]).view(np.uint8)
        value = rf"has {f.name} = -?{str(bad).lstrip('-')}"
        with pytest.raises(ModelError, match=rf"tensor 'blk.0.ffn_up.weight': row 2, block 1 \({fmt.name}\) "
                                             + value + "; 1 block"):
            check_finite_scales(fmt, broken_raw, "'blk.0.ffn_up.weight'")
        with pytest.raises(ModelError, match=rf"row 2, block 1 \({fmt.name}\) {value}"):  # rows of bytes, as stored
            check_finite_scales(fmt, broken_raw.reshape(3, -1), "x")
        with pytest.raises(ModelError, match=rf"block 9 \({fmt.name}\) {value}"):  # a flat buffer
            check_finite_scales(fmt, broken_raw.reshape(-1), "x")


def test_raw_bytes_must_be_whole_blocks():
    with pytest.raises(ValueError, match="not whole Q4_K blocks of 144 bytes"):
        dequantize(formats.Q4_K, np.zeros((2, 100), np.uint8))
    with pytest.raises(TypeError, match="uint8"):
        unpack(formats.Q8_0, np.zeros((2, 34), np.int16))


# --- the loader's stored blocks ------------------------------------------------------------

def test_weight_source_gives_stored_blocks_and_their_format(tmp_path, isolated_cache):
    cfg = tiny_config(hidden=64, head_dim=16, ffn=96)
    path = write_gguf(tmp_path / "q.gguf", cfg, random_weights(cfg), quantize=True)
    weights = load_model(path, progress=False).weights
    stored = weights.blocks("model.layers.1.mlp.down_proj.weight")
    assert stored.format is formats.Q8_0 and stored.type_name == "Q8_0"
    assert stored.data.shape == (64, 96 // 32, 34)
    assert bitwise_equal(dequantize(stored.format, stored.data), weights.tensor("model.layers.1.mlp.down_proj.weight"))
    norm = weights.blocks("model.norm.weight")
    assert norm.format is None and norm.type_name == "F32" and norm.data.shape == (1, 64 * 4)
    hf = load_model(write_hf_dir(tmp_path / "hf", cfg, random_weights(cfg)), progress=False)
    with pytest.raises(ModelError, match="no stored form other than float32"):
        hf.weights.blocks("model.norm.weight")


def test_weight_source_refuses_a_non_finite_scale(tmp_path, isolated_cache):
    cfg = tiny_config(hidden=64, head_dim=16, ffn=96)
    path = write_gguf(tmp_path / "q.gguf", cfg, random_weights(cfg), quantize=True)
    tensor = next(t for t in read_gguf(path).tensors if t.name == "blk.1.ffn_down.weight")
    data = bytearray(path.read_bytes())
    block = tensor.start + (5 * 3 + 2) * 34  # row 5, block 2
    data[block:block + 2] = np.array([np.inf], np.float16).tobytes()
    path.write_bytes(bytes(data))
    weights = load_model(path, progress=False).weights
    with pytest.raises(ModelError, match=r"tensor 'blk.1.ffn_down.weight' in .*q.gguf: row 5, block 2 \(Q8_0\) has "
                                         r"d = inf"):
        weights.blocks("model.layers.1.mlp.down_proj.weight")


def test_real_model_every_tensor_matches_gguf(real_model):
    """Every quantized tensor of the default Q4_K_M file, as the loader maps it, dequantized
    here and by gguf: bitwise equal. Round trips on the first 64 rows of each."""
    weights = real_model.weights
    counts: dict[str, int] = {}
    for name in weights:
        stored = weights.blocks(name)
        counts[stored.type_name] = counts.get(stored.type_name, 0) + 1
        if stored.format is None:
            continue
        assert stored.data.shape[:2] == (weights.shapes[name][0], weights.shapes[name][1] // stored.format.block)
        assert bitwise_equal(dequantize(stored.format, stored.data), gguf_dequantize(stored.format, stored.data)), name
        head = np.asarray(stored.data[:64])
        assert np.array_equal(pack(stored.format, unpack(stored.format, head)), head.reshape(-1, stored.format.nbytes))
    assert counts == {"Q5_0": 133, "Q8_0": 13, "Q6_K": 12, "Q4_K": 12, "F32": 121}
