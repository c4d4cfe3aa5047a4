"""What a frontend hands the compiler: the graphs of a step function and their signature.

The compiler core knows no model. A model is a step function: each call takes a chunk of new
rows (a sequence of ids), updates state in place (buffers that grow by one position per row,
such as a transformer's KV cache) and returns outputs per row. It is compiled once per variant
of which output rows a pass computes: the last row (the next token's logits), every row, or none
(the chunks of a long prompt before its last).

The signature names those parts as data, with the structure a library's interface needs (which
array and index a state buffer is), so no stage has to recognise them by their names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .graph import Graph

VARIANTS = ("last", "all", "none")  # which output rows a pass computes


def identifier(name: str) -> str:
    """A C identifier for a graph-level name: cache.3.k -> cache_3_k."""
    return re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_")


def weight_buffer(cname: str) -> str:
    """The loop IR's buffer for a weight: w_ and its C identifier."""
    return "w_" + cname


@dataclass(frozen=True)
class StepInput:
    """A per-step input: a sequence of ids, each checked to lie in [0, limit) before a step.
    item and limit_name word the error for an id outside it ("token id", "the vocabulary")."""
    name: str
    dtype: str = "i32"
    limit: int | None = None
    item: str = "id"
    limit_name: str = "the range"


@dataclass(frozen=True)
class State:
    """A buffer a step updates in place: the graph input `name` [a, past, b] is what it holds,
    the graph output `name` [a, past + seq, b] is that with the new rows appended along axis 1.
    Stored position-major, [n_ctx, a, b], so its strides do not depend on n_ctx. `array` and
    `index` place it in the library's interface (array[index])."""
    name: str
    array: str
    index: int
    row: int  # a * b: elements per position


@dataclass(frozen=True)
class StepOutput:
    """A per-row output of `row` elements."""
    name: str
    row: int


@dataclass(frozen=True)
class WeightSpec:
    name: str
    shape: tuple[int, ...]
    cname: str  # its C identifier (its buffer in the loop IR is w_ + cname)
    dtype: str = "f32"


@dataclass(frozen=True)
class Signature:
    name: str                             # the library's symbol prefix starts with it
    inputs: tuple[StepInput, ...]
    state: tuple[State, ...] = ()
    outputs: tuple[StepOutput, ...] = ()
    weights: tuple[WeightSpec, ...] = ()  # in the weights file's order
    max_positions: int = 0                # the most positions state holds (past + seq)
    description: tuple[str, ...] = ()     # lines for the generated C's header comment
    config: dict = field(default_factory=dict, hash=False, compare=False)  # in the fingerprint

    def state_named(self, name: str) -> State | None:
        return next((s for s in self.state if s.name == name), None)

    def weight_named(self, name: str) -> WeightSpec | None:
        return next((w for w in self.weights if w.name == name), None)

    def state_arrays(self) -> list[tuple[str, int]]:
        """(array, entries) for each state array, in the order the state lists them."""
        sizes: dict[str, int] = {}
        for s in self.state:
            sizes[s.array] = max(sizes.get(s.array, 0), s.index + 1)
        return list(sizes.items())


@dataclass
class StepProgram:
    """A frontend's whole product: the signature and one graph per variant."""
    signature: Signature
    graphs: dict[str, Graph]


def plain_signature(graph: Graph) -> Signature:
    """A graph as a function of its inputs alone, without state: what the per-graph test
    library compiles. Buffers are named in_*, w_* and out_*."""
    inputs = tuple(StepInput(name, node.dtype) for name, node in graph.inputs().items())
    outputs = tuple(StepOutput(name, 0) for name in graph.outputs)
    weights = tuple(WeightSpec(name, tuple(d.as_int() for d in node.shape), identifier(name), node.dtype)
                    for name, node in graph.weights().items())
    return Signature(graph.name, inputs, (), outputs, weights)
