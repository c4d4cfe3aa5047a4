"""The choices the command line offers, in a module that imports nothing: the command line reads
them before NumPy loads, so the BLAS thread count it sets still takes effect."""

PRECISIONS = ("f32", "int8")
# compiler.STAGES in order (tests/test_codegen.py checks they agree)
STAGE_NAMES = ("cse", "fold", "fusion", "lower", "link", "separate", "schedule", "memory")
