"""Helpers for the UI tests: stand-ins for widgets not in this checkout yet, and a recorded trace."""

from __future__ import annotations

import importlib
import json
import sys
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
