"""exp on every float32: the runtime's nc_expf (scalar) and nc_expf8/16 (the widest lanes this CPU
has) against the interpreter's definition, bit for bit, and the definition's error against exp
in float64, in units of the result's last place (subnormal results: 2^-149). About 3 minutes.

    python -m bench.probes.exp      # prints; appends to bench/results.jsonl
"""
from __future__ import annotations

import ctypes
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.support.measure import append

CHUNK = 1 << 24
SOURCE = """
#include "nc_vector.h"
void exp_scalar(const float *x, float *y, long n) { for (long i = 0; i < n; ++i) y[i] = nc_expf(x[i]); }
void exp_lanes(const float *x, float *y, long n)
{
#if defined(__AVX512F__)
    for (long i = 0; i + 16 <= n; i += 16) nc_store16(y + i, nc_expf16(nc_load16(x + i)));
#elif defined(__AVX2__)
    for (long i = 0; i + 8 <= n; i += 8) nc_store8(y + i, nc_expf8(nc_load8(x + i)));
#else
    exp_scalar(x, y, n);
#endif
}
int lanes(void)
{
#if defined(__AVX512F__)
    return 16;
#elif defined(__AVX2__)
    return 8;
#else
    return 1;
#endif
}
"""


def build(directory: Path) -> ctypes.CDLL:
    from nanocompile.codegen.data import data_root

    src, lib = directory / "exp_check.c", directory / "exp_check.so"
    src.write_text(SOURCE)
    subprocess.run(["cc", "-O2", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC",
                    f"-I{data_root() / 'runtime'}", str(src), "-o", str(lib), "-lm"], check=True)
    return ctypes.CDLL(str(lib))


def ulp_error(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    exact = np.exp(x.astype(np.float64))
    with np.errstate(over="ignore"):
        ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    return np.abs(y.astype(np.float64) - exact) / np.maximum(ulp, 2.0 ** -149)


def main() -> None:
    from nanocompile.ir.interpreter import nc_expf

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        lib = build(Path(d))
        out = np.empty(CHUNK, np.float32)
        mismatches = {"scalar": 0, "lanes": 0}
        worst, worst_at = 0.0, 0.0
        for first in range(0, 1 << 32, CHUNK):
            x = np.arange(first, first + CHUNK, dtype=np.uint64).astype(np.uint32).view(np.float32)
            with np.errstate(invalid="ignore", over="ignore"):
                want = nc_expf(x)
            for name in mismatches:
                getattr(lib, f"exp_{name}")(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                                            ctypes.c_long(CHUNK))
                mismatches[name] += int(np.count_nonzero(out.view(np.uint32) != want.view(np.uint32)))
            finite = np.isfinite(x) & (x > -104) & (x < np.float32(88.72283))  # beyond: 0 or +inf exactly
            err = ulp_error(want[finite], x[finite])
            if err.size and err.max() > worst:
                worst, worst_at = float(err.max()), float(x[finite][int(err.argmax())])
        lanes = lib.lanes()
    seconds = time.perf_counter() - start
    print(f"all 2^32 inputs: scalar mismatches {mismatches['scalar']}, {lanes}-lane mismatches {mismatches['lanes']}, "
          f"largest error {worst:.4f} ulp (at x = {worst_at!r}); {seconds:.0f} s")
    append({"bench": "exp_check", "inputs": 1 << 32, "lanes": lanes, "mismatches": mismatches,
            "max_ulp": worst, "max_ulp_at": worst_at, "seconds": seconds})


if __name__ == "__main__":
    main()
