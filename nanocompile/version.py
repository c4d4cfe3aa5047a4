"""What generated code and cached files record as their maker."""
from . import __version__

GENERATOR = f"nanocompile {__version__} codegen 2"
