"""Argument checks shared by the benchmarks' command lines: a count below its least refused at
once, in argparse's own words (exit 2), before a model is built."""

from __future__ import annotations

import argparse
from typing import Iterable


def require_at_least(parser: argparse.ArgumentParser, args: argparse.Namespace,
                     least: dict[str, int]) -> None:
    """`least` maps an option's destination (`block_size`) to its least value; an option given
    several values (nargs) must have each at least that; one left unset (None) is not checked."""
    for dest, minimum in least.items():
        value = getattr(args, dest)
        if value is None:
            continue
        values: Iterable[int] = value if isinstance(value, (list, tuple)) else [value]
        if any(v < minimum for v in values):
            parser.error(f"--{dest.replace('_', '-')}: each value must be at least {minimum}"
                         if isinstance(value, (list, tuple)) else
                         f"--{dest.replace('_', '-')} must be at least {minimum}")
