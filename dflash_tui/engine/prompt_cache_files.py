"""Saved conversation caches: a turn's target and draft caches on disk, so that reopening the
conversation (or restarting the app) does not prefill it again.

A file is one of mlx-lm's own prompt-cache files (`mlx_lm.models.cache.save_prompt_cache`):
safetensors holding each layer cache's `state`, its class name and string metadata. Its
caches, in order: the target's layers, the draft's layers, then for a hybrid target the
linear-attention states of its truncation snapshots (engine/hybrid.py), one `ArraysCache`
per linear layer per snapshot. The metadata says how many of each, the pair it belongs
to and the tokens the caches hold.

Files live in `<cache dir>/prompt-caches/<pair>/<tokens>.safetensors`: `<pair>` a hash of
the target's and the draft's names, parameter shapes and a few weight values (a different
model or draft never matches); `<tokens>` a hash of the pair key and the token prefix.
Past the size cap the least recently used files go first.

Nothing read is trusted: a file is used only if its pair key and token hash match, its
classes are the ones this pair makes, and every array has the shape and dtype a fresh
cache of this pair has after one token. Anything else (corrupt, truncated, foreign,
another model's) is skipped: the turn prefills as if there were no file. A directory
that cannot be written means no file, one notice, and the conversation goes on.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, save_prompt_cache

from dflash_tui.engine.hybrid import HybridCache, Snapshot
from dflash_tui.engine.state import common_prefix
from dflash_tui.engine.window_cache import WindowKVCache

FORMAT = "dflash-tui-prompt-cache/1"
SUFFIX = ".safetensors"
DEFAULT_CAP_BYTES = 2 * 2**30
MIN_GAIN = 16  # a file is loaded when it spares at least this many more tokens of prefill than memory does
_MAX_HEADER = 64 * 2**20  # a safetensors header larger than this is not one of ours
# the layer caches a file may hold: mlx-lm's own, by class name, and the engine's window cache
CLASSES: dict[str, type] = {c.__name__: c for c in (KVCache, RotatingKVCache, ArraysCache, WindowKVCache)}


@dataclass
class Entry:
    """A saved file as its header describes it (read without loading the arrays)."""

    path: Path
    tokens: list[int]
    snapshots: list[int]  # lengths of a hybrid target's truncation points
    hybrid: bool
    reusable: int  # how much of `tokens` a next turn of its conversation shares (the rest: the reply as generated)
    prefilled: int = 0  # leading tokens whose rows a prefill computed (DecodeState.prefilled)

    def usable(self, prompt: list[int]) -> int:
        """Tokens of `prompt` this file would spare from prefill (the engine prefills at least one)."""
        shared = common_prefix(self.tokens, prompt)
        shared = min(shared, len(prompt) - 1)
        if shared >= len(self.tokens) or not self.hybrid:
            return min(shared, len(self.tokens))
        return max((s for s in self.snapshots if s <= shared), default=0)  # a recurrent state rolls back only there


def pair_key(pair: Any) -> str:
    """A hash of what makes two loaded pairs' caches interchangeable: names, the draft's
    quantization, every parameter's name, shape and dtype, and a few weight values."""
    parts: list[Any] = [FORMAT, pair.target_name, pair.draft_name, getattr(pair, "draft_quant", 0)]
    models = [pair.target.model] + ([pair.draft] if pair.draft is not None else [])
    for model in models:
        flat = tree_flatten(model.parameters())
        parts.append([(k, list(v.shape), str(v.dtype)) for k, v in flat])
        for _, v in (flat[0], flat[len(flat) // 2], flat[-1]) if flat else ():
            parts.append(v.reshape(-1)[:32].astype(mx.float32).tolist())
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def tokens_key(pair: str, tokens: list[int]) -> str:
    return hashlib.sha256((pair + ":" + ",".join(map(str, tokens))).encode()).hexdigest()[:40]


def read_metadata(path: Path) -> Optional[dict[str, str]]:
    """The safetensors file's string metadata, reading only its header; None if it is not one."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                return None
            (n,) = struct.unpack("<Q", head)
            if not 2 <= n <= _MAX_HEADER:
                return None
            header = json.loads(fh.read(n))
    except (OSError, ValueError):  # unreadable, not JSON, not UTF-8
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else None


def own_metadata(meta: dict[str, str]) -> dict[str, str]:
    """The metadata given to `save_prompt_cache` (it flattens [metadata, classes, scalars] into one
    dict, so ours sits under the keys "0.<name>")."""
    return {k[2:]: v for k, v in meta.items() if isinstance(k, str) and k.startswith("0.")}


class PromptCacheFiles:
    """One pair's saved caches under `root`, within `cap_bytes` for the whole of `root`."""

    def __init__(self, pair: Any, root: Path, cap_bytes: int = DEFAULT_CAP_BYTES,
                 notify: Callable[[str], None] = lambda text: None) -> None:
        self.pair = pair
        self.root = Path(root)
        self.cap_bytes = cap_bytes
        self.key = pair_key(pair)
        self.dir = self.root / self.key[:24]
        self._notify = notify
        self._told = False
        self._template: Optional[tuple[list[Any], list[Any]]] = None
        self.last_loaded: Optional[Path] = None  # the file the last warm start used

    def _tell(self, text: str) -> None:
        """One notice per store: a full or read-only disk must not flood the user."""
        if not self._told:
            self._told = True
            self._notify(text)

    # -- finding ---------------------------------------------------------------
    def entries(self) -> list[Entry]:
        """This pair's files whose headers are ours (arrays not read)."""
        out = []
        try:
            paths = sorted(self.dir.glob("*" + SUFFIX))
        except OSError:
            return []
        for path in paths:
            entry = self._entry(path)
            if entry is not None:
                out.append(entry)
        return out

    def _entry(self, path: Path) -> Optional[Entry]:
        meta = read_metadata(path)
        meta = own_metadata(meta) if meta is not None else None
        if meta is None or meta.get("format") != FORMAT or meta.get("pair") != self.key:
            return None
        try:
            tokens = json.loads(meta["tokens"])
            snapshots = json.loads(meta.get("snapshots", "[]"))
            hybrid = meta.get("hybrid") == "1"
            reusable = int(meta.get("reusable", "0"))
            prefilled = int(meta.get("prefilled", "0"))
        except (KeyError, ValueError):
            return None
        vocab = self.pair.target.vocab_size
        if (not isinstance(tokens, list) or not tokens or not all(type(t) is int and 0 <= t < vocab for t in tokens)
                or not isinstance(snapshots, list) or not all(type(s) is int and 0 < s <= len(tokens) for s in snapshots)
                or path.stem != tokens_key(self.key, tokens)):
            return None
        return Entry(path, tokens, snapshots, hybrid, min(max(reusable, 0), len(tokens)),
                     min(max(prefilled, 0), len(tokens)))

    def best(self, prompt: list[int], already: int = 0) -> Optional[Entry]:
        """The file sparing the most prefill of `prompt`, if it spares MIN_GAIN tokens more than `already`."""
        windowed = getattr(self.pair.target, "windowed", False)  # only prefilled rows are exact there
        scored = [(min(e.usable(prompt), e.prefilled) if windowed else e.usable(prompt), e) for e in self.entries()]
        scored = [(n, e) for n, e in scored if n >= already + MIN_GAIN]
        return max(scored, key=lambda s: s[0])[1] if scored else None

    # -- loading ---------------------------------------------------------------
    def warm(self, state: Any, prompt: list[int]) -> int:
        """Put the saved caches that spare the most of `prompt`'s prefill into `state`, when they
        spare more than what `state` already holds; returns the tokens now held (0: nothing loaded)."""
        in_memory = min(common_prefix(state.tokens, prompt), len(prompt) - 1, state.exact_reuse())
        entry = self.best(prompt, already=in_memory)
        if entry is None:
            return 0
        caches = self._load(entry)
        if caches is None:
            return 0
        self._install(state, entry, *caches)
        self.last_loaded = entry.path
        try:
            os.utime(entry.path)  # recently used: evicted last
        except OSError:
            pass
        return len(entry.tokens)

    def _load(self, entry: Entry) -> Optional[tuple[list[Any], list[Any], list[list[Any]]]]:
        """(target caches, draft caches, snapshot states) of a file, all checked; None if anything is off."""
        try:
            arrays, meta = mx.load(str(entry.path), return_metadata=True)
            mx.eval(list(arrays.values()))  # read it all now: a truncated file fails here, not mid-turn
            caches = _rebuild(arrays, meta)
            ours = own_metadata(meta)
            n_target, n_draft = int(ours["n_target"]), int(ours["n_draft"])
            tmpl_target, tmpl_draft = self._templates()
        except Exception:  # corrupt, truncated, not ours: a cold prefill instead
            return None
        linear = [i for i, c in enumerate(tmpl_target) if isinstance(c, ArraysCache)]
        n_snap = len(entry.snapshots)
        if len(caches) != n_target + n_draft + n_snap * len(linear) or n_target != len(tmpl_target) \
                or n_draft != len(tmpl_draft) or (n_snap and not entry.hybrid):
            return None
        target, draft, rest = caches[:n_target], caches[n_target:n_target + n_draft], caches[n_target + n_draft:]
        n = len(entry.tokens)
        if not all(_matches(c, t, n) for c, t in zip(target, tmpl_target)):
            return None
        if not all(_matches(c, t, n) for c, t in zip(draft, tmpl_draft)):
            return None
        snaps = [rest[k * len(linear):(k + 1) * len(linear)] for k in range(n_snap)]
        if sorted(set(entry.snapshots)) != entry.snapshots or not all(
                _matches(c, tmpl_target[i], None) for snap in snaps for c, i in zip(snap, linear)):
            return None
        return target, draft, snaps

    def _templates(self) -> tuple[list[Any], list[Any]]:
        """Fresh caches of this pair after one token: the classes, shapes and dtypes a file must have."""
        if self._template is None:
            target, draft = self.pair.target, self.pair.draft
            tcache = target.make_cache()
            _, feats = target.forward(mx.array([[0]]), list(tcache))
            dcache = draft.make_cache() if draft is not None else []
            if draft is not None and feats is not None:
                draft.append_context(feats, dcache)
            mx.eval([c.state for c in tcache], [c.state for c in dcache])
            self._template = (list(tcache), dcache)
        return self._template

    def _install(self, state: Any, entry: Entry, target: list[Any], draft: list[Any], snaps: list[list[Any]]) -> None:
        n = len(entry.tokens)
        fresh = state.target.make_cache()
        if isinstance(fresh, HybridCache):
            cache = HybridCache(target)
            cache.length = n
            cache.snapshots = [Snapshot(length, [(c.cache[0], c.cache[1]) for c in snap])
                               for length, snap in zip(entry.snapshots, snaps)]
            target = cache
        state.target_cache = target
        state.draft_cache = draft if state.draft is not None else None
        state.tokens = list(entry.tokens)
        state.prefilled = entry.prefilled
        state.draft_len = n if state.draft is not None else 0
        state.pending = []

    # -- saving ----------------------------------------------------------------
    def save(self, state: Any, reusable: Optional[int] = None) -> Optional[Path]:
        """Write what `state` holds (the draft's pending features pushed in first); None when
        nothing was written (caching off, nothing held, a class we cannot restore, no room).
        `reusable`: how much of it a next turn of the conversation shares (default: all); a file
        the new one holds that much of is dropped (its conversation goes on in the new one)."""
        if self.cap_bytes <= 0 or not state.tokens:
            return None
        state.flush_pending()
        tokens = list(state.tokens)
        target = list(state.target_cache)
        draft = list(state.draft_cache or [])
        hybrid = isinstance(state.target_cache, HybridCache)
        snapshots = list(state.target_cache.snapshots) if hybrid else []
        snap_caches = [_arrays_cache(conv, rec) for s in snapshots for conv, rec in s.states]
        caches = target + draft + snap_caches
        if any(type(c).__name__ not in CLASSES or type(c) is not CLASSES[type(c).__name__] for c in caches):
            return None  # a layer cache this module cannot rebuild: no file rather than a wrong one
        path = self.dir / (tokens_key(self.key, tokens) + SUFFIX)
        try:
            if path.exists():
                os.utime(path)
                return path
            size = sum(v.nbytes for _, v in tree_flatten([c.state for c in caches]) if isinstance(v, mx.array))
            if size > self.cap_bytes:
                return None
            self._evict(self.cap_bytes - size)
            self.dir.mkdir(parents=True, exist_ok=True)
            meta = {"format": FORMAT, "pair": self.key, "tokens": json.dumps(tokens), "hybrid": "1" if hybrid else "0",
                    "snapshots": json.dumps([s.length for s in snapshots]), "n_target": str(len(target)),
                    "n_draft": str(len(draft)), "reusable": str(len(tokens) if reusable is None else reusable),
                    "prefilled": str(state.prefilled)}
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".writing-", suffix=SUFFIX)
            os.close(fd)
            try:
                save_prompt_cache(tmp, caches, meta)
                os.replace(tmp, path)  # a crash mid-write never leaves half a file under a real name
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except (OSError, RuntimeError) as exc:  # MLX reports a failed write (a full disk) as a RuntimeError
            why = getattr(exc, "strerror", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
            self._tell(f"conversation cache not saved ({why}): {self.root}")
            return None
        self._drop_superseded(tokens, path)
        return path

    def _drop_superseded(self, tokens: list[int], keep: Path) -> None:
        """Earlier turns of the same conversation: files whose reusable part the new one holds."""
        for e in self.entries():
            if e.path != keep and len(e.tokens) <= len(tokens) and common_prefix(e.tokens, tokens) >= max(e.reusable, 1):
                e.path.unlink(missing_ok=True)

    def _evict(self, budget: int) -> None:
        """Remove the least recently used files (every pair's) until they take at most `budget` bytes."""
        files = []
        for path in self.root.glob("*/*" + SUFFIX):
            try:
                st = path.stat()
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files, key=lambda f: f[0]):
            if total <= budget:
                break
            path.unlink(missing_ok=True)
            total -= size


def _arrays_cache(conv: Optional[mx.array], recurrent: Optional[mx.array]) -> ArraysCache:
    c = ArraysCache(2)
    c[0], c[1] = conv, recurrent
    return c


def _rebuild(arrays: dict[str, mx.array], meta: dict[str, str]) -> list[Any]:
    """mlx-lm's `load_prompt_cache`, with the class looked up in CLASSES (ours included) instead of
    mlx-lm's module globals, and no other class accepted."""
    tree = tree_unflatten(list(meta.items()))
    _, classes, scalars = tree
    values: dict[str, Any] = dict(arrays)
    for pos, kind in scalars[1:]:
        if kind == "scalar":
            values[pos] = values[pos].item()
        elif kind == "string":
            values[pos] = "".join(chr(i) for i in values[pos].tolist())
        elif kind == "none":
            values[pos] = None
        else:
            raise ValueError(f"unknown scalar kind {kind!r}")
    states = tree_unflatten(list(values.items()))
    if not isinstance(classes, list) or len(classes) != len(states) or any(c not in CLASSES for c in classes):
        raise ValueError("unknown cache classes")
    return [CLASSES[c].from_state(s) for c, s in zip(classes, states)]


def _same(a: Any, b: Any, seq_axis: Optional[int] = None) -> bool:
    """Arrays of one dtype and shape (the sequence axis aside)."""
    if not isinstance(a, mx.array) or not isinstance(b, mx.array) or a.dtype != b.dtype or a.ndim != b.ndim:
        return False
    return all(x == y for i, (x, y) in enumerate(zip(a.shape, b.shape)) if i != seq_axis)


def _matches(c: Any, tmpl: Any, tokens: Optional[int]) -> bool:
    """A loaded layer cache has the template's class and array shapes and holds `tokens` tokens."""
    if type(c) is not type(tmpl):
        return False
    if isinstance(c, ArraysCache):
        return (isinstance(c.cache, list) and len(c.cache) == len(tmpl.cache) and c.left_padding is None
                and c.lengths is None and all(_same(x, y) for x, y in zip(c.cache, tmpl.cache)))
    if not (_same(c.keys, tmpl.keys, 2) and _same(c.values, tmpl.values, 2) and type(c.offset) is int):
        return False
    held = c.keys.shape[2]
    if held != c.values.shape[2] or c.offset != tokens:
        return False
    if isinstance(c, WindowKVCache):
        return (c.max_size == tmpl.max_size and c.history == tmpl.history
                and min(c.max_size - 1, c.offset) <= held <= c.offset)
    if isinstance(c, RotatingKVCache):
        return c.max_size == tmpl.max_size and c.keep == tmpl.keep and 0 <= c._idx <= held
    return held >= c.offset
