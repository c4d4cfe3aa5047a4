"""The tests run against the installed package, not the source tree beside them."""
from pathlib import Path

import nanocompile


def test_imported_from_the_installed_package():
    repo = Path(__file__).resolve().parents[1]
    where = Path(nanocompile.__file__).resolve()
    assert "site-packages" in where.parts, where
    assert not where.is_relative_to(repo / "nanocompile"), where


def test_console_script_is_installed():
    import shutil
    assert shutil.which("nanocompile"), "the nanocompile command is not on PATH"
