"""What the target and draft caches hold between cycles and between turns."""

from __future__ import annotations

import time
from typing import Callable, Optional

import mlx.core as mx

from dflash_tui.engine.draft import DFlashDraft
from dflash_tui.engine.target import Target


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


MLX_LM_PREFILL_STEP = 2048  # mlx_lm.generate_step's prefill_step_size (stream_generate's default)
CPU_PREFILL_CHUNK = 512  # on the CPU: a Ctrl+C is answered between chunks


def default_prefill_chunk() -> int:
    """Tokens a prefill forward takes at most: on a GPU mlx-lm's own chunk, since a GPU may round
    a row with the number of rows computed together (a gemm's tiling) and the cache must be
    `stream_generate`'s; on the CPU, whose rows do not depend on it, shorter chunks for Ctrl+C."""
    return MLX_LM_PREFILL_STEP if mx.default_device() == mx.gpu else CPU_PREFILL_CHUNK


class DecodeState:
    """Target cache + draft cache + the tokens they hold.

    Invariant: the target cache holds `tokens`; the draft cache holds the first
    `draft_len` of them; `pending` holds target features for the rest, which the
    next draft forward pushes into the draft cache.
    """

    def __init__(self, target: Target, draft: Optional[DFlashDraft]):
        self.target = target
        self.draft = draft
        self.reset()

    def reset(self) -> None:
        self.target_cache = self.target.make_cache()
        self.draft_cache = self.draft.make_cache() if self.draft is not None else None
        self.tokens: list[int] = []
        # leading tokens whose cache rows a prefill computed, as a fresh mlx-lm run over a longer
        # prompt computes them too (the rest came from one-token steps and verifies)
        self.prefilled = 0
        self.draft_len = 0
        self.pending: list[mx.array] = []

    # -- features waiting for the draft ----------------------------------
    def _joined_pending(self) -> mx.array:
        if len(self.pending) == 1:
            return self.pending[0]
        return mx.concatenate(self.pending, axis=1)

    def take_pending(self) -> Optional[mx.array]:
        if not self.pending:
            return None
        feats = self._joined_pending()
        self.pending = []
        self.draft_len += feats.shape[1]
        return feats

    def flush_pending(self) -> None:
        feats = self.take_pending()
        if feats is not None and self.draft is not None:
            self.draft.append_context(feats, self.draft_cache)

    # -- rolling back to a shared prefix ----------------------------------
    def exact_reuse(self) -> int:
        """How much of its caches a turn may reuse and still equal a fresh mlx-lm run over the whole
        conversation: all of them, except behind a sliding window, whose one-token steps see their
        keys in ring order where a prefill sees them in time order (window_cache.py), so rows from
        steps and verifies are computed afresh."""
        return self.prefilled if self.target.windowed else len(self.tokens)

    def truncate(self, keep: int) -> int:
        """Keep the first `keep` cached tokens (fewer if the cache cannot roll back)."""
        n = len(self.tokens)
        if keep >= n:
            return n
        kept = self.target.truncate(self.target_cache, n, keep)
        if kept < 0:
            self.reset()
            return 0
        self.tokens = self.tokens[:kept]
        self.prefilled = min(self.prefilled, kept)
        if self.draft is not None:
            if self.draft_len > kept:
                for c in self.draft_cache:
                    c.trim(self.draft_len - kept)
                self.draft_len = kept
                self.pending = []
            elif self.pending:
                feats = self._joined_pending()[:, : kept - self.draft_len]
                self.pending = [feats] if feats.shape[1] else []
        return kept

    # -- prefill -----------------------------------------------------------
    def prefill(self, new_tokens: list[int], chunk: Optional[int] = None,
                should_cancel: Optional[Callable[[], bool]] = None) -> tuple[Optional[mx.array], float]:
        """Run `new_tokens` through the target (and their features into the draft).

        Returns the logits after the last token ([V]) and the seconds taken. `should_cancel` is
        asked between chunks: when it says stop, the logits are None and the caches hold the chunks done.
        """
        tic = time.perf_counter()
        chunk = chunk or default_prefill_chunk()
        self.flush_pending()
        logits = None
        total = len(self.tokens) + len(new_tokens)
        self.target.start_generation(self.target_cache, total)
        # as mlx-lm's generate_step: the prompt but its last token in chunks, then that token alone (the
        # first one-token step, which a sliding window's ring starts from)
        body = len(new_tokens) - 1
        pieces = [new_tokens[a : min(a + chunk, body)] for a in range(0, body, chunk)] + [new_tokens[body:]]
        for i, piece in enumerate(pieces):
            if i and should_cancel is not None and should_cancel():
                return None, time.perf_counter() - tic
            logits, feats = self.target.forward(mx.array(piece)[None], self.target_cache, last_only=True)
            if self.draft is not None and feats is not None:
                self.draft.append_context(feats, self.draft_cache)
                self.draft_len += len(piece)
            mx.eval(logits, [c.state for c in self.target_cache], self._draft_state())
            if len(piece) > 1:
                self.prefilled = len(self.tokens) + len(piece)
            self.tokens.extend(piece)
        assert logits is not None, "prefill needs at least one token"
        return logits[0, -1], time.perf_counter() - tic

    def _draft_state(self) -> list:
        if self.draft_cache is None:
            return []
        return self.draft.cache_arrays(self.draft_cache)
