"""Progress on stderr for what takes a while in opening a model (packing its weights)."""
from __future__ import annotations

import sys


def say(message: str) -> None:
    print(f"nanocompile: {message}", file=sys.stderr)


def progress_bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, leave=False)


def note_above(bar, message: str) -> None:
    """A note on a line of its own above a progress bar."""
    bar.write(f"nanocompile: {message}", file=sys.stderr)
