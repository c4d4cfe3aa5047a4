"""The compiler driver (driver.py: the stages in order, compile_program), the builder (build.py:
CMake, finding or building a library) and the single-graph harness the tests and the tuner use
(graph_library.py).

STAGE_NAMES lists the driver's stages in order; it lives here, importing nothing, so the command
line can offer them as choices before NumPy loads (driver.py asserts they agree)."""

STAGE_NAMES = ("cse", "fold", "fusion", "lower", "link", "separate", "schedule", "memory")
