"""Kernel names that say what a kernel computes and at what shape.

A fused kernel is named by the primitives it computes (recorded by lowering as it computes
them), never by searching its text: its reductions (matmuls and row reductions, counted), the
functions and selects worth knowing about, then its root and the output's shape, e.g.
rowreduce_sqrt_mul_seqx896 (an RMS norm) or matmul2_exp_mul_seqx4864 (SwiGLU's gate and up).
"""
from __future__ import annotations

from ..ir.expr import Expr
from ..ir.ops import MATMULS

FUNCTIONS = ("exp", "sqrt", "sin", "cos")
SELECTS = ("where", "concat")  # both become a select on the index


def slug(e: Expr) -> str:
    """A shape extent as part of an identifier: seq + 1 -> seqp1, past*2 -> past2."""
    text = str(e)
    return text.replace(" + ", "p").replace(" - ", "m").replace("*", "")


def kernel_name(root_op: str, computes, shape) -> str:
    parts = []
    matmuls = sum(op in MATMULS for op in computes)
    reductions = sum(op in ("reduce_sum", "reduce_max") for op in computes)
    if matmuls:
        parts.append("matmul" if matmuls == 1 else f"matmul{matmuls}")
    if reductions:
        parts.append("rowreduce" if reductions == 1 else f"rowreduce{reductions}")
    parts += [op for op in FUNCTIONS if op in computes]
    if any(op in computes for op in SELECTS):
        parts.append("select")
    parts.append("store" if root_op in MATMULS else root_op)
    return "_".join(parts) + "_" + ("x".join(slug(d) for d in shape) or "scalar")
