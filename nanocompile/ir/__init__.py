from .expr import PAST, SEQ, Expr, evaluate_shape, shape_str
from .graph import Graph, GraphBuilder, Node, format_graph, verify
from .ops import PRIMITIVES, IRError

__all__ = ["Expr", "SEQ", "PAST", "evaluate_shape", "shape_str", "Graph", "GraphBuilder", "Node",
           "format_graph", "verify", "IRError", "PRIMITIVES"]
