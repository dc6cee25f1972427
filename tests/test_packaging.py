"""What a plain (non-editable) install carries: every package of the source tree."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_in_the_tree_is_installed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    in_tree = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "dflash_tui").rglob("__init__.py")}
    assert in_tree - listed == set(), "packages missing from pyproject.toml's [tool.setuptools] packages"
