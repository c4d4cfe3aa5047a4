"""The precisions a user can ask for, in a module that imports nothing: the command line offers
them before NumPy loads, so the BLAS thread count it sets still takes effect."""

PRECISIONS = ("f32", "int8", "native")
# what a user who names no precision gets: native for a model file storing its matrices in block
# formats (a quantized GGUF), f32 otherwise (open.resolve_precision)
AUTO = "auto"
PRECISION_CHOICES = (AUTO,) + PRECISIONS
# the graph, and so the library, each precision runs: native is int8's graph fed the file's own
# blocks (models.quantize.NativeWeights). Read in one place: open.open_model.
GRAPH_OF = {"f32": "f32", "int8": "int8", "native": "int8"}
