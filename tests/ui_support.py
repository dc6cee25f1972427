"""Helpers for the UI tests: stand-ins for widgets not in this checkout yet, and a recorded trace."""

from __future__ import annotations

import importlib
import json
import sys
import time
import types
from pathlib import Path

DATA = Path(__file__).parent / "data"


def _module_missing(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        return exc.name == name
    return False


def install_placeholders() -> list[str]:
    """Minimal stand-ins for the acceptance view, meter and session store, only where missing."""
    from textual.widgets import Static

    installed = []
    if _module_missing("dflash_tui.ui.acceptance"):
        class AcceptanceView(Static):
            def __init__(self, **kw):
                super().__init__("", **kw)
                self.blocks = []
                self.decoder = None

            def add_blocks(self, blocks):
                self.blocks.extend(blocks)
                self.update("\n".join(f"{b.index}: {b.accepted}/{len(b.drafted)}" for b in self.blocks[-8:]))

            def reset(self):
                self.blocks = []
                self.update("")

            def set_decoder(self, fn):
                self.decoder = fn

        mod = types.ModuleType("dflash_tui.ui.acceptance")
        mod.AcceptanceView = AcceptanceView
        sys.modules[mod.__name__] = mod
        installed.append(mod.__name__)
    if _module_missing("dflash_tui.ui.meter"):
        class SystemMeter(Static):
            def __init__(self, **kw):
                super().__init__("", **kw)
                self.calls = []

            def _log(self, *a):
                self.calls.append(a)
                self.update(f"{len(self.calls)} updates; last {a[0]}")

            def on_prefill(self, ev): self._log("prefill", ev)
            def on_blocks(self, blocks, elapsed_s): self._log("blocks", len(blocks), elapsed_s)
            def on_done(self, ev): self._log("done", ev)
            def set_pair(self, target, draft, device): self._log("pair", target, draft, device)
            def set_settings(self, settings): self._log("settings", dict(settings))
            def set_baseline_tps(self, tps): self._log("baseline", tps)
            def set_memory(self, a, p, r): self._log("memory", a, p, r)

        mod = types.ModuleType("dflash_tui.ui.meter")
        mod.SystemMeter = SystemMeter
        sys.modules[mod.__name__] = mod
        installed.append(mod.__name__)
    if _module_missing("dflash_tui.sessions"):
        class _Message:
            def __init__(self, role, content, trace):
                self.role, self.content, self.trace = role, content, trace

        class Session:
            def __init__(self, target, draft, settings):
                self.target, self.draft, self.settings = target, draft, settings
                self.messages = []
                self.title = "untitled"

            def add_message(self, role, content, trace=None):
                self.messages.append(_Message(role, content, trace))

        class SessionStore:
            saved = []

            def __init__(self, root=None):
                self.root = root

            def new(self, target, draft, settings):
                return Session(target, draft, settings)

            def save(self, session):
                SessionStore.saved.append(session)
                return None

        mod = types.ModuleType("dflash_tui.sessions")
        mod.SessionStore, mod.Session = SessionStore, Session
        sys.modules[mod.__name__] = mod
        installed.append(mod.__name__)
    return installed


# -- a fixed trace for the snapshots -------------------------------------------------
TRACE_PATH = DATA / "chat_trace.json"

_REPLY = (
    "DFlash drafts a whole block of tokens at once, and the target checks them in **one** forward pass. "
    "The accepted prefix is the longest run where the draft agrees with the target:\n\n"
    "```python\ndef accepted(drafted, target):\n    n = 0\n    while n < len(drafted) and drafted[n] == target[n]:\n"
    "        n += 1\n    return n\n```\n\n"
    "The target's own token follows, so every cycle emits at least one token and the output is exactly "
    "what the target alone would have written."
)


def build_trace(seed: int = 7, block_size: int = 16) -> dict:
    """A reply cut into word pieces, decoded in DFlash cycles with a plausible acceptance pattern.

    The events have the engine's own shape (Prefill, Block..., Done), so the snapshots
    show what a real turn shows, without a model.
    """
    import random
    import re

    rng = random.Random(seed)
    pieces = re.findall(r"\n|[ ]*[^\s]+|[ ]+", _REPLY)
    vocab: dict[str, int] = {}
    ids = [vocab.setdefault(p, len(vocab) + 10) for p in pieces]
    junk = [" the", " a", " of", " pass", " it", ":", " block", " draft", "\n", " token", " n", " =", " 1"]
    for j in junk:
        vocab.setdefault(j, len(vocab) + 10)
    decoder = {i: p for p, i in vocab.items()}
    events: list[dict] = [{"type": "prefill", "prompt_tokens": 42, "cached_tokens": 0, "seconds": 0.084}]
    events.append({"type": "block", "index": 0, "drafted": [], "accepted": 0, "emitted": [ids[0]],
                   "text": decoder[ids[0]], "draft_ms": 0.0, "verify_ms": 0.0, "rollback_ms": 0.0})
    pos, index = 1, 1
    total_drafted = total_accepted = 0
    while pos < len(ids):
        left = len(ids) - pos
        accepted = min(left - 1, rng.choice([0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 10, 15]))
        drafted = ids[pos:pos + accepted]
        while len(drafted) < block_size - 1:
            t = vocab[rng.choice(junk)]
            if len(drafted) == accepted and pos + accepted < len(ids) and t == ids[pos + accepted]:
                continue  # the first rejected proposal must differ from the target's token
            drafted.append(t)
        emitted = ids[pos:pos + accepted + 1]
        events.append({"type": "block", "index": index, "drafted": drafted, "accepted": accepted,
                       "emitted": emitted, "text": "".join(decoder[t] for t in emitted),
                       "draft_ms": round(2.1 + rng.random(), 3), "verify_ms": round(9.0 + 2 * rng.random(), 3),
                       "rollback_ms": 0.05})
        total_drafted += len(drafted)
        total_accepted += accepted
        pos += accepted + 1
        index += 1
    cycles = index - 1
    decode_s = sum(e["draft_ms"] + e["verify_ms"] + e["rollback_ms"] for e in events[1:] if e["type"] == "block") / 1000
    stats = {"mode": "dflash", "block_size": block_size, "prompt_tokens": 42, "cached_tokens": 0, "prefill_s": 0.084,
             "prefill_tps": 500.0, "ttft_s": 0.084, "generated_tokens": len(ids), "decode_s": decode_s,
             "decode_tps": (len(ids) - 1) / decode_s, "cycles": cycles,
             "tokens_per_cycle": (len(ids) - 1) / cycles, "acceptance": total_accepted / total_drafted,
             "draft_ms": 0.0, "verify_ms": 0.0, "rollback_ms": 0.0, "peak_memory": 1_234_567_890}
    events.append({"type": "done", "tokens": ids, "text": "".join(pieces), "finish_reason": "stop", "stats": stats})
    return {"user": "How does DFlash decide which drafted tokens to keep?", "target": "Qwen/Qwen3-8B",
            "draft": "z-lab/Qwen3-8B-DFlash-b16", "device": "gpu · Apple M3 Max", "baseline_tps": 31.0,
            "memory": [9_876_543_210, 10_234_567_890, 11_111_111_111],
            "decoder": {str(k): v for k, v in decoder.items()}, "events": events}


def load_trace() -> dict:
    return json.loads(TRACE_PATH.read_text())


async def feed_trace(app, pilot, trace: dict, batch: int = 6) -> None:
    """Drive the app with the recorded trace through the same Messages the worker posts."""
    from dflash_tui.engine.events import event_from_dict
    from dflash_tui.ui import messages as msg

    decoder = {int(k): v for k, v in trace["decoder"].items()}
    events = [event_from_dict(e) for e in trace["events"]]
    app.post_message(msg.EngineReady(trace["target"], trace["draft"], trace["device"], 16,
                                     lambda i: decoder.get(i, f"<{i}>"), 1.2))
    app.post_message(msg.BaselineMeasured(trace["baseline_tps"], "probe"))
    app.post_message(msg.MemorySample(*trace["memory"]))
    await pilot.pause()
    app.start_turn(trace["user"])
    turn = app.turn_id
    blocks = [e for e in events if e.type == "block"]
    app.post_message(msg.TurnPrefill(turn, events[0]))
    for i in range(0, len(blocks), batch):
        chunk = blocks[i:i + batch]
        app.post_message(msg.TurnBlocks(turn, chunk, sum(b.draft_ms + b.verify_ms + b.rollback_ms for b in chunk) / 1000))
    app.post_message(msg.TurnDone(turn, events[-1], []))
    await pilot.pause()
    while app.generating:
        await pilot.pause(0.05)
    # let the final Markdown update, the footer and the rows' scroll settle, however busy the
    # machine is: wait until two pictures in a row are the same
    last = None
    for _ in range(40):
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.1)
        now = app.export_screenshot()
        if now == last:
            break
        last = now


class FakeConversation:
    """Yields the engine's event shapes at a chosen pace; no model."""

    def __init__(self, n: int, cycle_s: float):
        self.n, self.cycle_s = n, cycle_s
        self.messages = []
        self.saved = None  # no caches on disk

    def generate(self, text, settings, should_cancel):
        from dflash_tui.engine.events import Block, Done, Prefill

        yield Prefill(prompt_tokens=5, cached_tokens=0, seconds=0.01)
        for i in range(self.n):
            if should_cancel():
                break
            time.sleep(self.cycle_s)
            yield Block(index=i, drafted=[1, 2, 3], accepted=1, emitted=[1, 9], text="ab")
        yield Done(tokens=[1, 9] * self.n, text="ab" * self.n, finish_reason="length", stats={"mode": "dflash"})
