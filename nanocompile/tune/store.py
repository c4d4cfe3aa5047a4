"""Tuning results as readable JSON in the cache: one file per CPU model and ISA level, each
kernel under its name with the digest of what it computes (a changed kernel is not matched)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..models.cache import cache_dir
from ..schedule import directives
from ..target import cpu_model

FORMAT = 1
_DIRECTIVE = re.compile(r"(\w+)\((.*)\)")


def parse_directive(text: str):
    """A directive from its printed form, e.g. 'Split(i0, 6)'."""
    m = _DIRECTIVE.fullmatch(text.strip())
    cls = getattr(directives, m.group(1), None) if m else None
    if cls is None or not hasattr(cls, "__dataclass_fields__"):
        raise ValueError(f"not a schedule directive: {text!r}")
    args = [a.strip() for a in m.group(2).split(",")]
    return cls(*(int(a) if a.lstrip("-").isdigit() else a for a in args))


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
    """The file's contents, or an empty table; a damaged file is a clear error."""
    if not path.exists():
        return {"format": FORMAT, "kernels": {}}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); delete it to tune again") from None
    if data.get("format") != FORMAT or not isinstance(data.get("kernels"), dict):
        raise ValueError(f"{path}: not a nanocompile tuning file of format {FORMAT}; delete it to tune again")
    return data


def save(path: Path, data: dict) -> None:
    """Written whole to a temporary file and renamed: an interrupted write loses nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def tuned_table(march: str, path: Path | None = None) -> tuple:
    """(kernel digest, directives) for every kernel whose measured winner is in use on this CPU
    and level: what compile_model(tuned=...) takes. Empty without tuning."""
    data = load(path or store_path(march))
    return tuple(sorted((entry["digest"], parse_schedule(entry["use"]))
                        for entry in data["kernels"].values() if entry.get("use")))
