"""Mine (request, answer) pairs from Python source: docstring summary -> function.

A function's docstring summary line becomes the user's request; the function's
source, with its docstring removed, becomes the reply. Functions without a usable
docstring give a plainer request naming them ("Write the method `Stack.push`."),
so the target sees more Python; a share of those is kept (`named_per_cent`). Files are visited in
sorted order and pairs are de-duplicated, so the output depends only on the
files read. A stable hash of the request splits off a held-out set.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import sys
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

MAX_FILE_BYTES = 1_000_000


@dataclass(frozen=True)
class Example:
    prompt: str
    response: str
    source: str  # "relative/path.py:line"
    kind: str = "doc"  # "doc": the request is a docstring summary; "named": it names the function

    def to_json(self) -> str:
        data = {"prompt": self.prompt, "response": self.response, "source": self.source, "kind": self.kind}
        return json.dumps(data, ensure_ascii=False)


def default_roots() -> list[Path]:
    """The interpreter's standard library and its site-packages."""
    paths = sysconfig.get_paths()
    roots = {Path(paths["stdlib"]), Path(paths["purelib"]), Path(paths["platlib"])}
    return sorted(r for r in roots if r.is_dir())


def python_files(roots: Iterable[Path]) -> Iterator[tuple[Path, Path]]:
    """(root, file) for every .py file, sorted; site-packages is not walked twice from stdlib."""
    roots = sorted({Path(r).resolve() for r in roots})
    for root in roots:
        nested = [r for r in roots if r != root and root in r.parents]
        for f in sorted(root.rglob("*.py")):
            if any(n in f.parents for n in nested):
                continue
            yield root, f


def summary_line(doc: str) -> Optional[str]:
    """The docstring's first sentence-like line, if it reads like a request."""
    first = doc.strip().split("\n\n", 1)[0]
    line = " ".join(part.strip() for part in first.splitlines())
    if not 12 <= len(line) <= 160:
        return None
    if not line[0].isalpha() or not line.isascii():
        return None
    if any(mark in line for mark in (">>>", "::", "{", "}", "`", "|")):
        return None
    return line


def _source(lines: list[str], node: ast.AST, drop_docstring: bool) -> Optional[str]:
    """The function's source (without its docstring lines), dedented; None if it cannot be cut cleanly."""
    start, end = node.lineno - 1, node.end_lineno
    body = lines[start:end]
    if drop_docstring:
        doc = node.body[0]
        if doc.lineno - 1 <= start or doc.end_lineno >= end:
            return None  # docstring on the def line, or the body is only the docstring
        body = lines[start : doc.lineno - 1] + lines[doc.end_lineno : end]
    text = textwrap.dedent("".join(body)).rstrip() + "\n"
    try:
        ast.parse(text)
    except SyntaxError:
        return None
    return text


def _functions(tree: ast.AST) -> Iterator[tuple[ast.AST, Optional[str]]]:
    """(function node, name of the class it is a method of, if any), in source order."""
    stack: list[tuple[ast.AST, Optional[str]]] = [(tree, None)]
    found = []
    while stack:
        node, owner = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((child, owner))
                stack.append((child, None))
            elif isinstance(child, ast.ClassDef):
                stack.append((child, child.name))
            else:
                stack.append((child, owner))
    return iter(sorted(found, key=lambda pair: pair[0].lineno))


def _named_request(node: ast.AST, owner: Optional[str]) -> str:
    if owner:
        return f"Write the method `{owner}.{node.name}`."
    return f"Write the Python function `{node.name}`."


def _keep_named(rel: str, lineno: int, per_cent: int) -> bool:
    h = int.from_bytes(hashlib.blake2b(f"{rel}:{lineno}".encode(), digest_size=8).digest(), "big")
    return h % 100 < per_cent


def mine_file(path: Path, rel: str, max_chars: int, named_per_cent: int = 0) -> Iterator[Example]:
    try:
        raw = path.read_bytes()
    except OSError:
        return
    if len(raw) > MAX_FILE_BYTES:
        return
    try:
        text = raw.decode("utf-8")
        tree = ast.parse(text)
    except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
        return
    lines = text.splitlines(keepends=True)
    for node, owner in _functions(tree):
        doc = ast.get_docstring(node, clean=True)
        request = summary_line(doc) if doc else None
        if request is not None:
            kind = "doc"
        elif named_per_cent:
            kind = "named" if _keep_named(rel, node.lineno, named_per_cent) else "unseen"
            request = _named_request(node, owner)
        else:
            continue
        reply = _source(lines, node, drop_docstring=doc is not None)
        if reply is None or not reply.isascii() or "\t" in reply:
            continue
        if len(reply) > max_chars:
            if kind == "named":
                continue
            kind = "unseen"  # too long to train the target on, still a fair request
        yield Example(request, reply, f"{rel}:{node.lineno}", kind)


def mine(roots: Iterable[Path], max_chars: int = 1500, named_per_cent: int = 0) -> Iterator[Example]:
    """Every well-formed pair, in file order, de-duplicated on (prompt, response).

    "unseen" examples (requests the target never trains on) are de-duplicated
    apart, so they never change which training pairs are kept.
    """
    seen: dict[bool, set[bytes]] = {True: set(), False: set()}
    for root, f in python_files(roots):
        rel = f.relative_to(root).as_posix()
        for ex in mine_file(f, rel, max_chars, named_per_cent):
            key = hashlib.blake2b((ex.prompt + "\0" + ex.response).encode(), digest_size=16).digest()
            bucket = seen[ex.kind == "unseen"]
            if key in bucket:
                continue
            bucket.add(key)
            yield ex


def is_held_out(ex: Example, per_mille: int = 5) -> bool:
    """A stable, file-order-independent split on the request text (docstring requests only)."""
    if ex.kind != "doc":
        return False
    h = int.from_bytes(hashlib.blake2b(ex.prompt.encode(), digest_size=8).digest(), "big")
    return h % 1000 < per_mille


def _open(path: Path, mode: str):
    return gzip.open(path, mode + "t", encoding="utf-8") if path.suffix == ".gz" else open(path, mode, encoding="utf-8")


def write_corpus(roots: Iterable[Path], out_dir: Path, max_chars: int = 1500, held_out_per_mille: int = 5,
                 named_per_cent: int = 0) -> dict[str, int]:
    """Write train.jsonl.gz, heldout.jsonl (requests kept out of all training) and unseen.jsonl.gz.

    unseen.jsonl.gz holds requests whose functions the target does not train
    on: prompts for the draft's regeneration, on which the target has to
    write something new, as it will for users. Returns counts.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {"train": 0, "heldout": 0, "named": 0, "unseen": 0}
    held_prompts: set[str] = set()
    unseen_prompts: set[str] = set()
    train_path, held_path = out_dir / "train.jsonl.gz", out_dir / "heldout.jsonl"
    # mtime=0 keeps the gzip bytes identical from run to run
    with open(train_path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
            open(out_dir / "unseen.jsonl.gz", "wb") as raw_u, gzip.GzipFile(fileobj=raw_u, mode="wb", mtime=0) as unseen, \
            open(held_path, "w", encoding="utf-8") as held:
        for ex in mine(roots, max_chars, named_per_cent):
            if ex.kind == "unseen":
                if not is_held_out(Example(ex.prompt, "", ex.source), held_out_per_mille) and ex.prompt not in unseen_prompts:
                    unseen_prompts.add(ex.prompt)
                    unseen.write((json.dumps({"prompt": ex.prompt, "source": ex.source}) + "\n").encode("utf-8"))
                    counts["unseen"] += 1
                continue
            if is_held_out(ex, held_out_per_mille):
                if ex.prompt not in held_prompts:
                    held_prompts.add(ex.prompt)
                    held.write(ex.to_json() + "\n")
                    counts["heldout"] += 1
                continue
            gz.write((ex.to_json() + "\n").encode("utf-8"))
            counts["train"] += 1
            counts["named"] += ex.kind == "named"
    return counts


def read_examples(path: Path) -> list[dict]:
    with _open(Path(path), "r") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description="Mine (docstring summary, function) pairs from Python source.")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--root", type=Path, action="append", help="source root (default: stdlib + site-packages)")
    p.add_argument("--max-chars", type=int, default=1500)
    p.add_argument("--named-per-cent", type=int, default=0, help="share of undocumented functions to keep")
    args = p.parse_args(argv)
    counts = write_corpus(args.root or default_roots(), args.out, args.max_chars, named_per_cent=args.named_per_cent)
    print(json.dumps(counts), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
