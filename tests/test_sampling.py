"""Sampling stays lossless: DFlash with rejection sampling draws from the target's filtered distribution.

Statistical checks are chi-square goodness-of-fit tests against exact
distributions; every one is paired with a deliberately wrong sampler that the
same test must reject, so none of them can pass vacuously. Seeds are fixed, so
the verdicts are deterministic on a given platform.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable, Optional

import mlx.core as mx
import numpy as np
import pytest

from conftest import reference_tokens
from dflash_tui.engine import speculative
from dflash_tui.engine.conversation import Conversation, GenerationSettings
from dflash_tui.engine.events import Block, Done, Error
from dflash_tui.engine.sampling import (
    KeyStream,
    SamplingConfig,
    filter_logits,
    probabilities,
    speculative_accept,
)
from dflash_tui.engine.speculative import draft_logits

PASS = 1e-4  # a correct sampler fails this only by a 1-in-10,000 draw
FAIL = 1e-6  # a wrong sampler must be rejected far beyond chance


# -- chi-square without scipy --------------------------------------------------
def _upper_gamma_q(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x)."""
    if x <= 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:  # the series for P converges fast here
        term = total = 1.0 / a
        n = a
        while abs(term) > 1e-15 * abs(total):
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    # continued fraction for Q (modified Lentz)
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def chi_square_p(observed: dict, expected_probs: dict) -> float:
    """p-value of a goodness-of-fit test; cells expected < 5 times are pooled.

    Observations outside the support of `expected_probs` give p = 0.
    """
    n = sum(observed.values())
    if any(k not in expected_probs or expected_probs[k] <= 0 for k in observed):
        return 0.0
    cells = sorted(((n * p, observed.get(k, 0)) for k, p in expected_probs.items() if p > 0), reverse=True)
    merged: list[list[float]] = []
    pool_e = pool_o = 0.0
    for e, o in cells:
        if e >= 5:
            merged.append([e, o])
        else:
            pool_e, pool_o = pool_e + e, pool_o + o
    if pool_e > 0:
        if pool_e < 5 and merged:
            e, o = merged.pop()
            pool_e, pool_o = pool_e + e, pool_o + o
        merged.append([pool_e, pool_o])
    if len(merged) < 2:
        return 1.0
    stat = sum((o - e) ** 2 / e for e, o in merged)
    return _upper_gamma_q((len(merged) - 1) / 2, stat / 2)


def total_variation(observed: dict, expected_probs: dict) -> float:
    n = sum(observed.values())
    keys = set(observed) | set(expected_probs)
    return 0.5 * sum(abs(observed.get(k, 0) / n - expected_probs.get(k, 0.0)) for k in keys)


def test_chi_square_helper_is_calibrated():
    # known quantiles of chi-square: (dof, x, upper tail)
    for dof, x, tail in [(1, 3.841, 0.05), (4, 13.277, 0.01), (15, 25.0, 0.0498), (30, 50.892, 0.01), (2, 0.1, 0.951)]:
        assert _upper_gamma_q(dof / 2, x / 2) == pytest.approx(tail, abs=2e-3)
    fair = {i: 0.25 for i in range(4)}
    assert chi_square_p({0: 250, 1: 250, 2: 250, 3: 250}, fair) == pytest.approx(1.0)
    assert chi_square_p({0: 400, 1: 200, 2: 200, 3: 200}, fair) < FAIL
    assert chi_square_p({0: 1, 9: 1}, fair) == 0.0  # outside the support


# -- filters -------------------------------------------------------------------
def test_filters_keep_the_same_tokens_as_mlx_lm():
    """top-p, then min-p, then top-k, on temperature-1 log-probs: the same support as mlx-lm's sampler."""
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    mx.disable_compile()  # mlx-lm compiles its filters per shape and value: slow for a sweep, same results
    try:
        _sweep_filters_against_mlx_lm(apply_top_p, apply_min_p, apply_top_k)
    finally:
        mx.enable_compile()


def _sweep_filters_against_mlx_lm(apply_top_p, apply_min_p, apply_top_k) -> None:
    rng = np.random.default_rng(0)
    for _ in range(60):
        vocab = int(rng.integers(8, 200))
        logits = mx.array(rng.normal(size=(3, vocab)) * rng.uniform(0.5, 4), dtype=mx.float32)
        top_p = float(rng.choice([1.0, rng.uniform(0.05, 0.99)]))
        min_p = float(rng.choice([0.0, rng.uniform(0.0, 0.5)]))
        top_k = int(rng.choice([0, rng.integers(1, vocab + 3)]))
        config = SamplingConfig(temperature=0.7, top_p=top_p, top_k=top_k, min_p=min_p)
        ref = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if top_p < 1:
            ref = apply_top_p(ref, top_p)
        if min_p > 0:
            ref = apply_min_p(ref, min_p)
        if 0 < top_k < vocab:
            ref = apply_top_k(ref, top_k)
        mine = filter_logits(logits, config)
        assert (np.isfinite(np.array(mine)) == np.isfinite(np.array(ref))).all(), (top_p, min_p, top_k)
        # temperature scales the survivors only
        np.testing.assert_allclose(np.array(probabilities(logits, config)), np.array(mx.softmax(ref / 0.7, axis=-1)), atol=1e-6)


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2), dict(min_p=2.0)])
def test_bad_settings_are_one_error_event(qwen3_pair, bad):
    conv = Conversation(qwen3_pair)
    events = list(conv.generate_tokens([1, 2, 3], GenerationSettings(max_tokens=4, **{"temperature": 1.0, **bad})))
    assert len(events) == 1 and isinstance(events[0], Error), events
    assert list(bad)[0] in events[0].message


# -- the rejection step on fixed distributions, vectorised -------------------------
# a target that ignores its prefix: its conditionals are these rows, so the whole
# output must be i.i.d. across positions with these marginals
P = np.array([
    [0.40, 0.25, 0.20, 0.15, 0.00],  # token 4 impossible for the target
    [0.05, 0.10, 0.15, 0.30, 0.40],
    [0.30, 0.30, 0.20, 0.10, 0.10],
    [0.10, 0.20, 0.30, 0.20, 0.20],  # bonus row
], dtype=np.float32)
Q = np.array([
    [0.10, 0.20, 0.30, 0.10, 0.30],  # proposes token 4, which must always be rejected
    [0.05, 0.10, 0.15, 0.30, 0.40],  # equal to p: always accepted
    [0.00, 0.50, 0.20, 0.20, 0.10],  # token 0 only reachable through the residual
], dtype=np.float32)
N_CYCLES = 60_000

AcceptFn = Callable[[mx.array, Optional[mx.array], mx.array, mx.array], mx.array]


def wrong_ignores_q(drafted, q, p, key):
    """Accepts every proposal the target allows and resamples from p: the draft leaks into the output."""
    return speculative_accept(drafted, mx.zeros_like(p[..., :-1, :]), p, key)


def wrong_resamples_from_p(drafted, q, p, key):
    """Right acceptance test, but a rejection draws from p instead of the residual."""
    result = speculative_accept(drafted, q, p, key)
    accepted = result[..., 0]
    row = mx.take_along_axis(p, accepted[..., None, None], axis=-2)[..., 0, :]
    fresh = mx.random.categorical(mx.log(row), key=mx.random.split(key)[1]).astype(mx.int32)
    return mx.stack([accepted, fresh], axis=-1)


def run_cycles(accept: AcceptFn, one_hot: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """N_CYCLES independent cycles at once; each output is extended to n+1 tokens with fresh target draws,
    as the next cycle would produce them. Returns (sequences [N, n+1], accepted [N])."""
    n = Q.shape[0]
    k_draft, k_accept, k_tail = mx.random.split(mx.random.key(seed), 3)
    p = mx.broadcast_to(mx.array(P), (N_CYCLES, n + 1, P.shape[1]))
    if one_hot:
        drafted = mx.broadcast_to(mx.array(Q.argmax(-1).astype(np.int32)), (N_CYCLES, n))  # a deterministic draft
        q = None
    else:
        q = mx.broadcast_to(mx.array(Q), (N_CYCLES, n, Q.shape[1]))
        drafted = mx.random.categorical(mx.log(q), key=k_draft).astype(mx.int32)
    result = np.array(accept(drafted, q, p, k_accept))
    tail = np.array(mx.random.categorical(mx.log(p), key=k_tail))  # [N, n+1]
    drafted = np.array(drafted)
    accepted, token = result[:, 0], result[:, 1]
    pos = np.arange(n + 1)[None, :]
    seq = np.where(pos < accepted[:, None], np.pad(drafted, ((0, 0), (0, 1))), tail)
    seq[np.arange(N_CYCLES), accepted] = token
    return seq, accepted


def joint_target_probs() -> dict:
    v = P.shape[1]
    out = {}
    for cell in np.ndindex(*([v] * P.shape[0])):
        prob = float(np.prod([P[i, t] for i, t in enumerate(cell)]))
        if prob > 0:
            out[cell] = prob
    return out


def acceptance_probs(one_hot: bool) -> dict:
    """P(accepted = k): proposal i is accepted with probability sum_x min(p_i, q_i)."""
    if one_hot:
        alpha = [float(P[i, Q[i].argmax()]) for i in range(Q.shape[0])]
    else:
        alpha = [float(np.minimum(P[i], Q[i]).sum()) for i in range(Q.shape[0])]
    probs, reach = {}, 1.0
    for k, a in enumerate(alpha):
        probs[k] = reach * (1 - a)
        reach *= a
    probs[len(alpha)] = reach
    return probs


def rejection_verdict(accept: AcceptFn, one_hot: bool) -> tuple[float, float, float]:
    """(p-value of the joint output, TV distance, p-value of the accepted-count distribution)."""
    seq, accepted = run_cycles(accept, one_hot)
    observed = Counter(map(tuple, seq.tolist()))
    want = joint_target_probs()
    return chi_square_p(observed, want), total_variation(observed, want), chi_square_p(Counter(accepted.tolist()), acceptance_probs(one_hot))


@pytest.mark.parametrize("one_hot", [False, True], ids=["sampled-q", "one-hot-q"])
def test_rejection_step_reproduces_the_target_exactly(one_hot):
    joint_p, tv, accept_p = rejection_verdict(speculative_accept, one_hot)
    assert joint_p > PASS, (joint_p, tv)
    assert accept_p > PASS, accept_p
    # the same test catches the usual mistakes
    for wrong in (wrong_ignores_q, wrong_resamples_from_p):
        bad_p, bad_tv, _ = rejection_verdict(wrong, one_hot)
        assert bad_p < FAIL, (wrong.__name__, bad_p, bad_tv)


def test_rejection_step_never_emits_what_the_target_rules_out():
    seq, accepted = run_cycles(speculative_accept, one_hot=False)
    assert not (seq[:, 0] == 4).any()  # p_0(4) = 0 although q_0 proposes it 30% of the time
    assert (accepted >= 0).all() and (accepted <= Q.shape[0]).all()


# -- end to end on the tiny pair ---------------------------------------------------
TOP_K = 2
TEMPERATURE = 0.8
DEPTH = 4  # tokens per run: the first from prefill, then cycles of up to 3 (block capped by max_tokens)


class TargetTable:
    """The target's exact next-token logits after the prompt plus a few generated tokens (full recompute)."""

    def __init__(self, pair, prompt: list[int]):
        self.model = pair.target.model
        self.prompt = prompt
        self.eos = set(pair.target.tokenizer.eos_token_ids)
        self._cache: dict[tuple, np.ndarray] = {}

    def logits(self, generated: tuple) -> np.ndarray:
        if generated not in self._cache:
            out = self.model(mx.array([self.prompt + list(generated)]))[0, -1].astype(mx.float32)
            self._cache[generated] = np.array(out)
        return self._cache[generated]

    def filtered_probs(self, generated: tuple, top_k: int, temperature: float) -> np.ndarray:
        """Independent of the engine's filter code: numpy top-k then softmax at temperature."""
        logits = self.logits(generated)
        keep = np.argsort(-logits)[:top_k]
        z = logits[keep] / temperature
        probs = np.zeros_like(logits)
        probs[keep] = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        return probs

    def sequence_probs(self, depth: int, top_k: int, temperature: float) -> dict:
        """Exact distribution of the first `depth` tokens (a stop token ends a sequence early)."""
        out: dict[tuple, float] = {}

        def walk(prefix: tuple, prob: float) -> None:
            if len(prefix) == depth or (prefix and prefix[-1] in self.eos):
                out[prefix] = out.get(prefix, 0.0) + prob
                return
            probs = self.filtered_probs(prefix, top_k, temperature)
            for t in np.nonzero(probs)[0]:
                walk(prefix + (int(t),), prob * float(probs[t]))

        walk((), 1.0)
        return out


def twin_logits(table: TargetTable, context: tuple) -> np.ndarray:
    """The target's logits with its two best tokens swapped and sharpened: q overlaps p but is far from it."""
    logits = table.logits(context).copy()
    first, second = np.argsort(-logits)[:2]
    logits[first], logits[second] = logits[second], logits[first]
    return logits * 3.0


def twin_proposer(table: TargetTable, prompt_len: int):
    """A draft built on `twin_logits`. Like a real block draft it sees only the committed
    context: position i>1 assumes the target's argmax continuation, not the proposals before it."""

    def propose(state, token, b):
        real = draft_logits(state, token, b)  # the real draft still runs: its cache keeps flowing
        context = tuple(state.tokens[prompt_len:]) + (token,)
        rows = []
        for _ in range(b - 1):
            rows.append(twin_logits(table, context))
            context = context + (int(np.argmax(table.logits(context))),)
        return mx.array(np.stack(rows)) + 0 * real

    return propose


def first_proposal_acceptance(table: TargetTable, q_known: bool) -> dict:
    """P(the first cycle accepts its first proposal), exactly: sum_x min(p, q) when the loop
    carries the draft's q, sum_x q p when it (wrongly, though still losslessly) treats q as one-hot."""
    rate = 0.0
    first = table.filtered_probs((), TOP_K, TEMPERATURE)
    for t in np.nonzero(first)[0]:
        p = table.filtered_probs((int(t),), TOP_K, TEMPERATURE)
        z = twin_logits(table, (int(t),))
        keep = np.argsort(-z)[:TOP_K]
        q = np.zeros_like(z)
        q[keep] = np.exp(z[keep] / TEMPERATURE - (z[keep] / TEMPERATURE).max())
        q /= q.sum()
        rate += first[t] * float(np.minimum(p, q).sum() if q_known else (p * q).sum())
    return {True: rate, False: 1 - rate}


@pytest.fixture(scope="module")
def e2e(qwen3_pair):
    conv = Conversation(qwen3_pair)
    conv.messages.append({"role": "user", "content": "hi"})
    prompt = conv.prompt_tokens()
    conv.messages.clear()
    table = TargetTable(qwen3_pair, prompt)
    return conv, prompt, table, table.sequence_probs(DEPTH, TOP_K, TEMPERATURE)


def sample_sequences(conv: Conversation, prompt: list[int], seeds, **settings) -> tuple[Counter, list[Done], list[list[Block]]]:
    """Counts of the first DEPTH tokens over seeded runs, each run's Done, and each run's drafted blocks."""
    eos = next(iter(conv.eos_ids))
    counts: Counter = Counter()
    dones, blocks = [], []
    for seed in seeds:
        events = list(conv.generate_tokens(prompt, GenerationSettings(
            max_tokens=DEPTH, block_size=8, temperature=TEMPERATURE, top_k=TOP_K, seed=seed, **settings)))
        done = events[-1]
        assert isinstance(done, Done), done
        # a stop token is not reported in `tokens`; put it back so sequences match the exact tree
        counts[tuple(done.tokens) + ((eos,) if done.finish_reason == "stop" else ())] += 1
        dones.append(done)
        blocks.append([e for e in events if isinstance(e, Block) and e.drafted])
    return counts, dones, blocks


def test_dflash_first_tokens_follow_the_target(e2e, monkeypatch):
    """400 seeded runs with a draft close to the target: the joint of the first 4 tokens is the target's."""
    conv, prompt, table, exact = e2e
    monkeypatch.setattr(conv, "propose", twin_proposer(table, len(prompt)))
    counts, _, runs = sample_sequences(conv, prompt, range(400))
    p_value, tv = chi_square_p(counts, exact), total_variation(counts, exact)
    assert p_value > PASS, (p_value, tv)
    # every verification path ran: rejection at the first and second proposal, and a full accept
    depths = Counter(b.accepted for blocks in runs for b in blocks)
    assert set(depths) >= {0, 1, 2}, depths
    # the loop carried the draft's q: the first proposal is accepted at the rate sum(min(p, q))
    first_accepts = Counter(blocks[0].accepted >= 1 for blocks in runs)
    assert chi_square_p(first_accepts, first_proposal_acceptance(table, q_known=True)) > PASS, first_accepts
    assert chi_square_p(first_accepts, first_proposal_acceptance(table, q_known=False)) < FAIL, first_accepts

    # the same test rejects a verifier that ignores the draft's q ...
    monkeypatch.setattr(speculative, "speculative_accept", lambda x, q, p, k: speculative_accept(x, mx.zeros_like(q), p, k))
    bad_counts, _, _ = sample_sequences(conv, prompt, range(150))
    assert chi_square_p(bad_counts, exact) < FAIL, total_variation(bad_counts, exact)
    # ... and one that draws from p instead of the residual after a rejection
    monkeypatch.setattr(speculative, "speculative_accept", wrong_resamples_from_p)
    bad_counts, _, _ = sample_sequences(conv, prompt, range(400))
    assert chi_square_p(bad_counts, exact) < FAIL, total_variation(bad_counts, exact)


def test_dflash_with_its_own_draft_follows_the_target(e2e, monkeypatch):
    """The default path (draft logits -> filtered q -> sampled proposals). The random draft's
    top tokens rarely meet the target's, so this checks the plumbing; the twin test carries the power."""
    conv, prompt, _, exact = e2e
    counts, dones, _ = sample_sequences(conv, prompt, range(1000, 1200))
    assert chi_square_p(counts, exact) > PASS, total_variation(counts, exact)
    assert all(d.stats["mode"] == "dflash" for d in dones)
    # a verifier that waves every proposal through lets the draft's own tokens out
    def accept_all(x, q, p, k):
        r = speculative_accept(x, q, p, k)
        return mx.stack([mx.array(x.shape[-1], mx.int32), r[1]])

    monkeypatch.setattr(speculative, "speculative_accept", accept_all)
    bad_counts, _, _ = sample_sequences(conv, prompt, range(50))
    assert chi_square_p(bad_counts, exact) < FAIL


def test_baseline_first_tokens_follow_the_target(e2e):
    conv, prompt, _, exact = e2e
    counts, dones, runs = sample_sequences(conv, prompt, range(2000, 2300), baseline=True)
    assert chi_square_p(counts, exact) > PASS, total_variation(counts, exact)
    assert not any(runs) and all(d.stats["mode"] == "baseline" for d in dones)
    # the test is sharp enough to tell these samples from a sampler running at temperature 2
    _, _, table, _ = e2e
    assert chi_square_p(counts, table.sequence_probs(DEPTH, TOP_K, 2.0)) < FAIL


# -- filters, seeds, acceptance ------------------------------------------------------
def allowed(logits: np.ndarray, top_k: int, top_p: float, min_p: float, slack: float = 1e-4) -> np.ndarray:
    """Tokens each filter lets through, computed independently (a little slack for float noise)."""
    logp = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
    ok = np.ones_like(logits, dtype=bool)
    order = np.argsort(-logp)
    if top_k:
        ok &= logp >= logp[order[top_k - 1]] - slack
    if top_p < 1:
        mass_before = np.cumsum(np.exp(logp[order])) - np.exp(logp[order])
        last = order[(mass_before < top_p + slack).sum() - 1]
        ok &= logp >= logp[last] - slack
    if min_p:
        ok &= logp >= logp.max() + math.log(min_p) - slack
    return ok


@pytest.mark.parametrize("filters", [dict(top_k=5), dict(top_p=0.3), dict(min_p=0.5)], ids=["top-k", "top-p", "min-p"])
@pytest.mark.parametrize("baseline", [False, True], ids=["dflash", "baseline"])
def test_no_token_outside_the_filter_ever_appears(qwen3_pair, filters, baseline):
    conv = Conversation(qwen3_pair)
    prompt = list(qwen3_pair.target.tokenizer.encode("tell me a story"))
    seen = set()
    for seed in range(12):
        done = list(conv.generate_tokens(prompt, GenerationSettings(
            max_tokens=24, block_size=6, temperature=1.5, seed=seed, baseline=baseline, **filters)))[-1]
        assert isinstance(done, Done)
        # the target's logits before every generated token, in one forward
        logits = np.array(qwen3_pair.target.model(mx.array([prompt + done.tokens]))[0, len(prompt) - 1 :].astype(mx.float32))
        for i, tok in enumerate(done.tokens):
            ok = allowed(logits[i], filters.get("top_k", 0), filters.get("top_p", 1.0), filters.get("min_p", 0.0))
            assert ok[tok], (seed, i, tok, int(ok.sum()))
        seen.update(done.tokens)
    # the check has teeth: at temperature 1.5 an unfiltered sampler spreads far wider than this
    assert len(seen) > 5


def generated(conv: Conversation, prompt: list[int], **settings) -> list[int]:
    done = list(conv.generate_tokens(prompt, GenerationSettings(max_tokens=24, block_size=8, temperature=0.9, **settings)))[-1]
    assert isinstance(done, Done)
    return done.tokens


@pytest.mark.parametrize("baseline", [False, True], ids=["dflash", "baseline"])
def test_same_seed_same_output_different_seeds_differ(qwen3_pair, baseline):
    prompt = list(qwen3_pair.target.tokenizer.encode("once upon a time"))
    conv = Conversation(qwen3_pair)
    first = generated(conv, prompt, seed=7, top_p=0.9, baseline=baseline)
    # a fresh conversation, and a reused cache, give the same tokens
    assert generated(Conversation(qwen3_pair), prompt, seed=7, top_p=0.9, baseline=baseline) == first
    assert generated(conv, prompt, seed=7, top_p=0.9, baseline=baseline) == first
    # other code moving mlx's global random state changes nothing
    mx.random.seed(12345)
    mx.eval(mx.random.uniform(shape=(10,)))
    assert generated(conv, prompt, seed=7, top_p=0.9, baseline=baseline) == first
    outputs = {tuple(generated(conv, prompt, seed=s, top_p=0.9, baseline=baseline)) for s in range(5)}
    assert len(outputs) == 5
    # no seed: fresh randomness every run, and the seed it drew is reported, so the run can be redone
    events = list(conv.generate_tokens(prompt, GenerationSettings(max_tokens=24, block_size=8, temperature=0.9, top_p=0.9, baseline=baseline)))
    unseeded = events[-1]
    assert unseeded.tokens != generated(conv, prompt, top_p=0.9, baseline=baseline)
    assert generated(conv, prompt, top_p=0.9, baseline=baseline, seed=unseeded.stats["seed"]) == unseeded.tokens


def test_generation_leaves_the_global_random_state_alone(qwen3_pair):
    prompt = list(qwen3_pair.target.tokenizer.encode("hello"))
    mx.random.seed(99)
    want = mx.random.uniform(shape=(4,)).tolist()
    mx.random.seed(99)
    generated(Conversation(qwen3_pair), prompt, seed=3)
    assert mx.random.uniform(shape=(4,)).tolist() == want


def test_key_stream_is_reproducible_and_independent_of_global_state():
    a, b = KeyStream(5), KeyStream(5)
    mx.random.seed(0)
    draws_a = [mx.random.uniform(key=a.next()).item() for _ in range(3)]
    mx.random.seed(1)
    draws_b = [mx.random.uniform(key=b.next()).item() for _ in range(3)]
    assert draws_a == draws_b and len(set(draws_a)) == 3
    assert KeyStream(-1).seed == 2**64 - 1  # any int is a seed


def test_acceptance_is_reported_under_sampling(e2e, monkeypatch):
    conv, prompt, table, _ = e2e
    monkeypatch.setattr(conv, "propose", twin_proposer(table, len(prompt)))
    for seed in range(20):  # the first run whose draft got something accepted
        events = list(conv.generate_tokens(prompt, GenerationSettings(
            max_tokens=12, block_size=4, temperature=TEMPERATURE, top_k=TOP_K, seed=seed)))
        blocks = [e for e in events if isinstance(e, Block) and e.drafted]
        if any(b.accepted for b in blocks):
            break
    done = events[-1]
    assert isinstance(done, Done)
    for b in blocks:
        assert 0 <= b.accepted <= len(b.drafted)
        assert b.emitted[: b.accepted] == b.drafted[: b.accepted]
    assert done.stats["cycles"] == len(blocks)
    assert done.stats["acceptance"] == pytest.approx(sum(b.accepted for b in blocks) / sum(len(b.drafted) for b in blocks))
    assert done.stats["acceptance"] > 0


def test_temperature_zero_is_the_greedy_path(qwen3_pair):
    """Filters and seed do nothing at temperature 0: still token-for-token mlx-lm greedy."""
    prompt = list(qwen3_pair.target.tokenizer.encode("greedy please"))
    want = reference_tokens(qwen3_pair, prompt, 30)
    for baseline in (False, True):
        done = list(Conversation(qwen3_pair).generate_tokens(prompt, GenerationSettings(
            max_tokens=30, block_size=8, temperature=0.0, top_k=3, top_p=0.5, min_p=0.2, seed=11, baseline=baseline)))[-1]
        assert done.tokens == want
