"""The corpus miner: deterministic, well-formed (request, function) pairs."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

from dflash_tui.training.corpus import is_held_out, mine, read_examples, summary_line, write_corpus

SOURCE_A = '''
def add(a, b):
    """Return the sum of a and b.

    Longer text that is not part of the request.
    """
    return a + b


class Stack:
    def push(self, item):
        """Push an item onto the top of the stack."""
        self.items.append(item)

    def pop(self):
        return self.items.pop()

    def peek(self): "Look at the top item without removing it."; return self.items[-1]


def only_doc():
    """Does nothing at all, on purpose."""


async def fetch(url):
    """Fetch a URL and return the body as text."""
    async with session.get(url) as r:
        return await r.text()
'''

SOURCE_B = '''
def broken(:
    """This file does not parse."""
'''

SOURCE_C = '''
def add(a, b):
    """Return the sum of a and b."""
    return a + b


def weird():
    """>>> weird()"""
    return 1
'''


def _tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text(textwrap.dedent(SOURCE_A))
    (root / "pkg" / "b.py").write_text(SOURCE_B)
    (root / "c.py").write_text(SOURCE_C)
    return root


def test_pairs_are_well_formed(tmp_path):
    root = _tree(tmp_path / "src")
    pairs = list(mine([root]))
    by_prompt = {p.prompt: p for p in pairs}
    assert set(by_prompt) == {
        "Return the sum of a and b.",
        "Push an item onto the top of the stack.",
        "Fetch a URL and return the body as text.",
    }
    add = by_prompt["Return the sum of a and b."]
    assert add.response == "def add(a, b):\n    return a + b\n"  # docstring gone, dedented
    assert add.source == "c.py:2"  # files in sorted order; the duplicate in pkg/a.py is dropped
    push = by_prompt["Push an item onto the top of the stack."]
    assert push.response.startswith("def push(self, item):\n") and '"""' not in push.response
    for p in pairs:
        ast.parse(p.response)
        assert p.kind == "doc" and p.response.endswith("\n")


def test_named_requests_for_undocumented_functions(tmp_path):
    root = _tree(tmp_path / "src")
    named = [p for p in mine([root], named_per_cent=100) if p.kind == "named"]
    prompts = {p.prompt for p in named}
    assert "Write the method `Stack.pop`." in prompts
    assert "Write the Python function `weird`." in prompts  # a docstring that reads like no request


def test_corpus_is_deterministic(tmp_path):
    root = _tree(tmp_path / "src")
    one, two = tmp_path / "one", tmp_path / "two"
    assert write_corpus([root], one, held_out_per_mille=500) == write_corpus([root], two, held_out_per_mille=500)
    for name in ("train.jsonl.gz", "heldout.jsonl"):
        assert (one / name).read_bytes() == (two / name).read_bytes()
    rows = read_examples(one / "train.jsonl.gz") + read_examples(one / "heldout.jsonl")
    assert len(rows) == 3 and all(set(r) == {"prompt", "response", "source", "kind"} for r in rows)
    held = {r["prompt"] for r in read_examples(one / "heldout.jsonl")}
    train = {r["prompt"] for r in read_examples(one / "train.jsonl.gz")}
    assert not held & train
    json.dumps(rows)


def test_summary_line_filters():
    assert summary_line("Return x.\n\nMore.") is None  # too short to be a request
    assert summary_line("Return the value\nof the thing.") == "Return the value of the thing."
    assert summary_line(":param x: the thing to return") is None
    assert summary_line("Compute `x` squared for the caller.") is None


def test_held_out_split_is_by_request_text():
    from dflash_tui.training.corpus import Example

    a = Example("Return the sum of a and b.", "def f(): pass\n", "x.py:1")
    b = Example("Return the sum of a and b.", "def g(): pass\n", "y.py:9")
    assert is_held_out(a, 500) == is_held_out(b, 500)
    assert not is_held_out(Example("Write the Python function `f`.", "", "", "named"), 1000)


def test_unseen_requests_are_kept_apart(tmp_path):
    root = _tree(tmp_path / "src")
    out = tmp_path / "c"
    counts = write_corpus([root], out, held_out_per_mille=0, named_per_cent=50)
    train = read_examples(out / "train.jsonl.gz")
    unseen = read_examples(out / "unseen.jsonl.gz")
    assert counts["unseen"] == len(unseen) > 0
    named_train = {r["prompt"] for r in train if r["kind"] == "named"}
    assert not named_train & {r["prompt"] for r in unseen}
    # every undocumented function lands on exactly one side
    assert named_train | {r["prompt"] for r in unseen} >= {"Write the method `Stack.pop`.", "Write the Python function `weird`."}
    # the training pairs are the same as without the unseen split
    plain = write_corpus([root], tmp_path / "p", held_out_per_mille=0, named_per_cent=50)
    assert plain["train"] == counts["train"]


def test_draft_prompt_mix(tmp_path):
    import gzip

    from dflash_tui.training.build_demo import draft_prompts

    train = [{"prompt": f"train {i}"} for i in range(10)]
    with gzip.open(tmp_path / "unseen.jsonl.gz", "wt") as f:
        for i in range(10):
            f.write(json.dumps({"prompt": f"unseen {i}"}) + "\n")
    mix = draft_prompts(train, tmp_path / "unseen.jsonl.gz", 8, 0.5, seed=0)
    texts = [m[0]["content"] for m in mix]
    assert len(texts) == 8 and sum(t.startswith("unseen") for t in texts) == 4
    assert texts == [m[0]["content"] for m in draft_prompts(train, tmp_path / "unseen.jsonl.gz", 8, 0.5, seed=0)]
    assert all(t.startswith("train") for t in (m[0]["content"] for m in draft_prompts(train, tmp_path / "none.gz", 5, 0.5, 0)))
