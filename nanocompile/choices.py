"""The choices the command line offers, in a module that imports nothing: the command line reads
them before NumPy loads, so the BLAS thread count it sets still takes effect."""

PRECISIONS = ("f32", "int8", "native")
# what a user who names no precision gets: native for a model file storing its matrices in block
# formats (a quantized GGUF), f32 otherwise (checks.resolve_precision)
AUTO = "auto"
PRECISION_CHOICES = (AUTO,) + PRECISIONS
# the graph, and so the library, each precision runs: native is int8's graph fed the file's own
# blocks where they are exact in int8's form (quantize.NativeWeights)
GRAPH_OF = {"f32": "f32", "int8": "int8", "native": "int8"}
GRAPH_PRECISIONS = ("f32", "int8")
# compiler.STAGES in order (tests/test_codegen.py checks they agree)
STAGE_NAMES = ("cse", "fold", "fusion", "lower", "link", "separate", "schedule", "memory")
