"""Benchmarks. They measure the installed package (with the library `pip install .` built), not
the source tree beside them: `python -m bench.X` would otherwise import ./nanocompile first."""
import os
import sys

_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _root]
