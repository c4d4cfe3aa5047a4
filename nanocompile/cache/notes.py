"""One-line notes on standard error: what the cache did that the user should know about."""
from __future__ import annotations

import sys


def note(message: str) -> None:
    print(f"nanocompile: {message}", file=sys.stderr, flush=True)
