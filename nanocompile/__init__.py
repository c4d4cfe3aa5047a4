"""nanocompile: an ahead-of-time tensor compiler for the Qwen2 transformer."""
__version__ = "0.1.0"
