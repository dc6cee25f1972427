"""What a plain (non-editable) install carries: every package of the source tree."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_in_the_tree_is_installed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    in_tree = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "dflash_tui").rglob("__init__.py")}
    assert in_tree - listed == set(), "packages missing from pyproject.toml's [tool.setuptools] packages"


def test_every_file_of_the_demo_pair_is_installed():
    import fnmatch

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages, patterns = set(setuptools["packages"]), setuptools["package-data"]["*"]
    files = [p for p in (ROOT / "dflash_tui" / "demo").rglob("*") if p.is_file() and p.suffix != ".py"
             and "__pycache__" not in p.parts]
    assert len(files) >= 9  # the target's weights, tokenizer and config, the draft's, the held-out prompts
    for f in files:
        package = ".".join(f.parent.relative_to(ROOT).parts)
        assert package in packages and any(fnmatch.fnmatch(f.name, pat) for pat in patterns), f
