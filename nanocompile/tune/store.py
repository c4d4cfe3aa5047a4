"""Tuning results as readable JSON in the cache: one file per CPU model and ISA level, each
kernel under its name with the digest of what it computes (a changed kernel is not matched)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..cache.files import AtomicFile
from ..cache.location import cache_dir
from ..cache.notes import note
from ..target import cpu_model

FORMAT = 1
_DIRECTIVE = re.compile(r"(\w+)\((.*)\)")


def parse_directive(text: str):
    """A directive from its printed form, e.g. 'Split(i0, 6)'."""
    from ..schedule import directives  # here: a run with no tuned schedules never loads the scheduler

    m = _DIRECTIVE.fullmatch(text.strip())
    cls = getattr(directives, m.group(1), None) if m else None
    if cls is None or not hasattr(cls, "__dataclass_fields__"):
        raise ValueError(f"not a schedule directive: {text!r}")
    def value(a: str):
        return int(a) if a.lstrip("-").isdigit() else a

    args, keywords = [], {}
    for a in (a.strip() for a in m.group(2).split(",")):
        name, eq, v = a.partition("=")  # Pack(p2, 896, 64, 4, offset=128)
        if eq:
            keywords[name.strip()] = value(v.strip())
        else:
            args.append(value(a))
    return cls(*args, **keywords)


def schedule_text(schedule) -> list[str]:
    return [str(d) for d in schedule]


def parse_schedule(texts) -> tuple:
    return tuple(parse_directive(t) for t in texts)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "unknown-cpu"


def store_path(march: str, cpu: str | None = None, root: Path | None = None) -> Path:
    """Where this CPU's results for an ISA level live."""
    return (root or cache_dir()) / "tuned" / f"{_slug(cpu or cpu_model())}-{march}.json"


def load(path: Path) -> dict:
    """The file's contents, or an empty table. A damaged file is never used: it is ignored with a
    note (the recipes' schedules run instead; `nanocompile tune` measures again and replaces it)."""
    empty = {"format": FORMAT, "kernels": {}}
    if not path.exists():
        return empty
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        note(f"{path}: damaged tuning results ({e}); ignored, the recipes' schedules are used")
        return empty
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("kernels"), dict):
        note(f"{path}: not a nanocompile tuning file of format {FORMAT}; ignored, the recipes' schedules are used")
        return empty
    return data


def save(path: Path, data: dict) -> None:
    """Written whole to a temporary file, flushed and renamed: an interrupted write loses nothing."""
    with AtomicFile(path) as out:
        out.write((json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def tuned_table(march: str, path: Path | None = None) -> tuple:
    """(kernel digest, directives, the recipe they were measured against) for every kernel whose
    measured winner is in use on this CPU and level: what compile_model(tuned=...) takes (the
    compiler uses a winner only while that recipe is still the kernel's). Empty without tuning."""
    path = path or store_path(march)
    data = load(path)
    try:
        return tuple(sorted((entry["digest"], parse_schedule(entry["use"]),
                             parse_schedule(entry["recipe"]) if entry.get("recipe") is not None else None)
                            for entry in data["kernels"].values() if entry.get("use")))
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        note(f"{path}: damaged tuning results ({type(e).__name__}: {e}); ignored, the recipes' schedules are used")
        return ()
