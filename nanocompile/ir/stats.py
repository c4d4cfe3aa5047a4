"""Node counts of a Qwen2 graph: per block, outside the blocks, whole model."""
from __future__ import annotations

from .graph import Graph


def node_counts(graph: Graph, n_layers: int) -> dict:
    blocks = [graph.op_counts(f"layers.{i}") for i in range(n_layers)]
    per_block = [sum(c.values()) for c in blocks]
    total = len(graph.nodes)
    return {
        "total": total,
        "per_block": per_block[0] if per_block else 0,
        "all_blocks_equal": all(c == blocks[0] for c in blocks),
        "outside": total - sum(per_block),
        "block_ops": blocks[0] if blocks else {},
    }
