"""`nanocompile graph`: the Qwen2 graph's node counts, or the graph itself."""
from __future__ import annotations

import sys


def cmd_graph(args) -> int:
    from ..frontend import Qwen2Config, build_qwen2
    from ..ir import format_graph

    if args.model:
        from ..models import load_model
        cfg = load_model(args.model, progress=not args.quiet).config
    else:
        cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                          num_key_value_heads=2, vocab_size=151936)
    if args.layers is not None:
        cfg = Qwen2Config(**{**cfg.__dict__, "num_hidden_layers": args.layers})
    graph = build_qwen2(cfg)
    if args.passes:
        from ..passes.cse import cse
        from ..passes.fold import fold_constants
        graph = fold_constants(cse(graph))
    if args.print:
        sys.stdout.write(format_graph(graph))
        return 0
    from ..ir.stats import node_counts
    counts = node_counts(graph, cfg.num_hidden_layers)
    print(f"nodes, whole model ({cfg.num_hidden_layers} layers): {counts['total']}")
    print(f"nodes per transformer block: {counts['per_block']}")
    print(f"nodes outside the blocks: {counts['outside']}")
    print("per block: " + ", ".join(f"{op} {n}" for op, n in counts["block_ops"].items()))
    return 0


def add_parser(sub) -> None:
    graph = sub.add_parser("graph", help="node counts of the Qwen2 graph, or the graph itself")
    graph.add_argument("-m", "--model", help="take the config from this model (default: Qwen2.5-0.5B's)")
    graph.add_argument("--layers", type=int, help="override the number of layers")
    graph.add_argument("--print", action="store_true", help="print the graph IR")
    graph.add_argument("--passes", action="store_true", help="after common-subexpression elimination and folding")
    graph.add_argument("-q", "--quiet", action="store_true")
    graph.set_defaults(func=cmd_graph)
