"""The package's folders follow the data (docs/ARCHITECTURE.md), and no import runs from a lower
layer to a higher one: every module's imports, at the top or inside a function, name only its own
layer or the ones below it. The package face (nanocompile/__init__.py) loads the API lazily and
sits above everything."""
import ast
from pathlib import Path

import pytest

import nanocompile

ROOT = Path(nanocompile.__file__).parent

# lowest first; a module may import from its own layer and the layers before it
LAYERS = [
    ("foundation", {"errors", "version", "target", "results", "cache"}),
    ("graph IR", {"ir"}),
    ("frontend", {"frontend"}),
    ("passes", {"passes"}),
    ("loop IR", {"loopir"}),
    ("schedules", {"schedule"}),
    ("codegen", {"codegen"}),
    ("compiler", {"compiler"}),
    ("tuning", {"tune"}),
    ("models", {"models"}),
    ("engine", {"engine"}),
    ("API", {"api"}),
    ("server", {"server"}),
    ("command line", {"cli", "generate", "__main__", "__init__"}),
]
RANK = {part: rank for rank, (_, parts) in enumerate(LAYERS) for part in parts}
LOOSE = {"__init__", "__main__", "api", "results", "errors", "version", "target", "generate"}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def layer_of(module: str) -> str:
    """The first part of a module's name inside the package (engine.open -> engine)."""
    return module.split(".")[0]


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, the imported module's name inside the package) for every import of the package."""
    name = module_name(path, root)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if name in ("__init__", "__main__"):
        package = []
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                if not target:  # `from . import x` in a loose module: x itself
                    out += [(node.lineno, a.name) for a in node.names]
                    continue
            elif node.module and node.module.startswith("nanocompile."):
                target = node.module[len("nanocompile."):]
            else:
                continue
            out.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name[len("nanocompile."):]) for a in node.names if a.name.startswith("nanocompile.")]
    return out


def test_every_module_is_in_a_layer():
    unplaced = sorted({layer_of(module_name(f)) for f in ROOT.rglob("*.py")} - set(RANK))
    assert not unplaced, f"modules in no layer of tests/test_layers.py: {unplaced}"


def test_only_a_handful_of_loose_modules():
    loose = {f.stem for f in ROOT.glob("*.py")}
    assert loose <= LOOSE, sorted(loose - LOOSE)


@pytest.mark.slow
def test_no_import_runs_up_the_layers():
    upward = []
    for f in sorted(ROOT.rglob("*.py")):
        here = layer_of(module_name(f))
        for line, target in imports(f):
            there = layer_of(target)
            if RANK[there] > RANK[here]:
                upward.append(f"{f.relative_to(ROOT)}:{line} ({here}) imports {target} ({there})")
    assert not upward, "\n".join(upward)


def test_no_two_modules_share_a_name_for_different_jobs():
    """A module's name says its job, so no file name appears in two folders (a folder's __init__
    aside, and cli/, whose modules are named after the commands they implement)."""
    names: dict[str, list[str]] = {}
    for f in ROOT.rglob("*.py"):
        if f.name != "__init__.py" and f.parent.name != "cli":
            names.setdefault(f.stem, []).append(str(f.relative_to(ROOT)))
    shared = {n: sorted(fs) for n, fs in names.items() if len(fs) > 1}
    assert not shared, shared


def test_the_layer_test_sees_an_upward_import(tmp_path):
    """The check itself: a graph-IR module importing the engine, at the top or in a function, is found."""
    fake = tmp_path / "ir" / "graph.py"
    fake.parent.mkdir()
    fake.write_text("from ..loopir import ir\n\ndef f():\n    from ..engine.open import open_model\n")
    found = {target for _, target in imports(fake, tmp_path)}
    assert found == {"loopir", "engine.open"}
    assert RANK[layer_of("engine.open")] > RANK["ir"] >= RANK[layer_of("loopir")] - 3
