"""The compiler core knows no model: nothing under passes/, loopir/, schedule/ or codegen/ names
Qwen2, tokens, logits or the cache (what is an input, state or output comes from the signature),
and no function-local import there dodges an import cycle."""
import ast
import re
from pathlib import Path

import nanocompile

CORE = ("passes", "loopir", "schedule", "codegen")
MODEL_WORDS = re.compile(r"qwen|token|logit|cache", re.IGNORECASE)


def core_files():
    root = Path(nanocompile.__file__).parent
    return [f for d in CORE for f in sorted((root / d).glob("*.py"))]


def test_core_never_names_the_model():
    found = [f"{f.parent.name}/{f.name}:{i}: {line.strip()}" for f in core_files()
             for i, line in enumerate(f.read_text().splitlines(), 1) if MODEL_WORDS.search(line)]
    assert not found, "\n".join(found)


def test_core_imports_at_the_top():
    local = []
    for f in core_files():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                local += [f"{f.name}:{n.lineno}" for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not local, local
