"""exp in compiled order: interpreter.nc_expf is the definition, the runtime's nc_expf (scalar)
and nc_expfL (vector lanes) compute it bit for bit, and it is within one ulp of exp.

The accuracy bound was checked on every float32 once (docs/results/phase6.md: at most 0.99 ulp,
C and NumPy identical on all 2^32 inputs: `python -m bench.probes.exp`, 3 minutes); here on a sample that covers the
whole range, subnormal results and the edges of overflow included."""
import numpy as np
import pytest
from helpers import SEQ, make_graph, require_lanes

from nanocompile.compiler.graph_library import GraphLibrary
from nanocompile.ir.interpreter import nc_expf

pytestmark = [pytest.mark.c, pytest.mark.levels]

COLUMNS = 4096
SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.0, -1.0, 88.72283, 88.722839,
                    88.7228394, 88.8, 89.0, 89.5, 1e30, -1e30, -87.33654, -87.3366, -103.278931, -103.97,
                    -103.972084, -104.0, -104.5, -150.0, 0.5 * np.log(2), -0.5 * np.log(2), 3.4028235e38,
                    -3.4028235e38], np.float32)


def samples(rng) -> np.ndarray:
    """16 x 4096 float32 values: the special ones, every bit pattern at random (NaNs with payloads,
    subnormals, huge values), and uniform values over [-110, 95] where exp's result is finite or
    just overflows."""
    bits = rng.integers(0, 2 ** 32, 8 * COLUMNS, dtype=np.uint64).astype(np.uint32).view(np.float32)
    uniform = rng.uniform(-110, 95, 8 * COLUMNS - SPECIAL.size).astype(np.float32)
    return np.concatenate([SPECIAL, bits, uniform]).reshape(16, COLUMNS)


def ulp_error(got: np.ndarray, x: np.ndarray) -> np.ndarray:
    """|got - exp(x)| in units of the last place of exp(x) as a float32 (subnormals: 2^-149)."""
    exact = np.exp(x.astype(np.float64))
    with np.errstate(over="ignore"):
        ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / np.maximum(ulp, 2.0 ** -149)


def test_definition_is_within_one_ulp_and_exact_at_the_edges():
    x = samples(np.random.default_rng(0)).ravel()
    y = nc_expf(x)
    assert y.dtype == np.float32
    finite = np.isfinite(x) & (x > -104) & (x < 88.72283)  # beyond: exp rounds to 0 or +inf
    assert ulp_error(y[finite], x[finite]).max() < 1.0
    assert np.array_equal(np.isnan(y), np.isnan(x))  # NaN in, NaN out; nothing else NaN
    nan = np.isnan(x)
    assert np.array_equal(y[nan].view(np.uint32), x[nan].view(np.uint32))  # the same NaN, payload and sign
    assert np.all(y[x >= np.float32(88.7228394)] == np.inf)
    assert np.all(y[x <= np.float32(-104)] == 0)
    assert nc_expf(np.float32([0.0, -0.0]))[0] == 1 and nc_expf(np.float32([-0.0]))[0] == 1
    assert np.all(y[~nan] >= 0)


@pytest.mark.parametrize("lanes", [None, 8, 16])
def test_compiled_exp_is_the_definition_bit_for_bit(lanes):
    """The generated kernel, scalar and in vector lanes, on every kind of input."""
    if lanes:
        require_lanes(lanes)
    g = make_graph("exp", lambda b: b.exp(b.input("x", [SEQ, COLUMNS])))
    lib = GraphLibrary(g, fuse=True, schedule="default" if lanes else None, lanes=lanes)
    assert ("nc_expf(" in lib.source) == (lanes is None) and (f"nc_expf{lanes}(" in lib.source) == bool(lanes)
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = samples(rng)
        got = lib.run({"seq": 16, "past": 0}, {"x": x}, {}, threads=2)["out0"]
        assert np.array_equal(got.view(np.uint32), nc_expf(x).view(np.uint32))
