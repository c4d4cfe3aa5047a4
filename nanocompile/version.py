"""The package's version (pyproject.toml reads it from here) and what generated code and cached
files record as their maker."""

__version__ = "0.1.0"

GENERATOR = f"nanocompile {__version__} codegen 2"
