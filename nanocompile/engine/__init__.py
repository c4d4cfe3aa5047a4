"""The engine: a model source opened (open.py), its packed weights (pack.py), the compiled and
interpreted sessions (compiled.py, library.py, interpreted.py), sampling, stop sequences and the
one generation loop (stream.py). Nothing is imported here, so that the command line can read
precision.py before NumPy loads."""
