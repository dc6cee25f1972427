"""Loading a pair from the app: the request, its progress, and what a new pair (or a failed load) changes.

A load that fails keeps the pair in use and its conversation (the engine loads
no weights before the files are found and checked, and reloads the pair before
if the new weights fail). Mixed into the app (ui/app.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dflash_tui.config import save_settings
from dflash_tui.demo import is_demo_path
from dflash_tui.engine.block_limit import refusal
from dflash_tui.model_names import draft_label, model_label
from dflash_tui.printable import plain
from dflash_tui.ui import messages as msg
from dflash_tui.ui.messages import while_shown
from dflash_tui.ui.worker import Load


@dataclass
class PendingLoad:
    model: str
    draft: Optional[str]
    remember: bool  # write the pair to config.toml once it loads
    keep_chat: bool  # the conversation shown goes on with the new pair (a session being opened)


class PairLoading:
    """The app's part in loading a pair."""

    def block_for(self, model: str) -> "int | str":
        """The block size a pair starts with: the user's if they chose one (config.toml, a flag, /block, or
        set on the app before it runs); else the demo pair drafts its own size always (it is there to show
        acceptance, even where drafting is slower than the target alone) and any other pair adapts (auto)."""
        if self.options.block_size != self.block_default:
            return self.options.block_size
        return 0 if is_demo_path(model) else self.loaded_config.config.block_size

    def load_model(self, model: str, draft: Optional[str] = None, remember: bool = False,
                   keep_chat: bool = False) -> None:
        """Load a pair in the engine thread; once it is ready, a new pair starts a new conversation
        unless `keep_chat`. Until then the chat and the pair in use stay."""
        if self.generating:
            self.notify("A reply is streaming; press Esc to stop it first", severity="warning")
            return
        self.model_state = "loading"
        self._pending_load = PendingLoad(model, draft, remember, keep_chat)
        self.chat.show_loading(model)
        self.engine.submit(Load(model, draft, self.trust_remote_code, self.probe_tokens, self.system_prompt or None,
                                block_size=self.block_for(model) or None, draft_quant=self.options.draft_quant,
                                prompt_cache_bytes=int(self.options.prompt_cache_gb * 2**30)))

    @while_shown
    def on_engine_loading(self, message: msg.EngineLoading) -> None:
        panel = self.chat.loading_panel or self.chat.show_loading(message.model)
        panel.set_progress(message.stage, message.fraction)

    @while_shown
    async def on_engine_ready(self, message: msg.EngineReady) -> None:
        pending, self._pending_load = self._pending_load, None
        self.chat.hide_loading()
        if pending is not None and not pending.keep_chat and self.chat.messages():
            await self.chat.clear()  # the engine starts the new pair on a new conversation
            if self.system_prompt:
                self.chat.add_system(self.system_prompt)
        self.model_state = "ready"
        self.target_name, self.draft_name = message.target, message.draft
        self.draft_block_size = message.block_size
        self.device = message.device
        self.server = message.server
        self.decoder = message.decoder
        self.baseline_tps = None
        self.session, self._session_after_load = self._session_after_load, None  # a new pair, a new session
        if self.session is not None:
            self.session.decoder = message.decoder
        self.acceptance.reset(self.acceptance_mode())
        self.acceptance.set_decoder(message.decoder)
        self.meter.reset_pair()  # none of the figures of the pair before
        server = message.server
        self.meter.set_pair(message.target, message.draft, message.device, no_draft=message.no_draft,
                            where=server.url if server is not None else None)
        target = model_label(message.target)  # a name, never an install path
        self.chat.border_title = plain(f"conversation · {target}")
        if server is not None:
            how = ("its blocks stream live" if server.kind == "dflash" else
                   "its speculative figures, if it reports any, come after each reply")
            self.chat.add_note(f"Connected to {server.where}: {message.target}; {how}.")
        elif message.draft:
            draft = draft_label(message.target, message.draft)
            draft = draft if draft == "its draft" else f"draft {draft}"
            if message.draft_quant:
                draft += f" ({message.draft_quant}-bit linear layers)"
            self.chat.add_note(f"Loaded {target} with {draft} in {message.seconds:.1f} s.")
        else:
            self.chat.add_note(f"Loaded {target} in {message.seconds:.1f} s with no draft "
                               f"({message.no_draft or 'none given'}): the target runs alone.")
        if pending is not None:
            users = self.options.block_size != self.block_default
            self.options.block_size = self.block_for(pending.model)
            self.block_default = None if users else self.options.block_size
            if message.draft and server is None and not users and is_demo_path(pending.model):
                self.chat.add_note(f"The demo drafts blocks of {message.block_size} always, to show acceptance, even "
                                   "where drafting is slower than the target alone (the meter says which); /block "
                                   "auto adapts instead.")
        block = self.options.block_size
        too_big = isinstance(block, int) and message.draft and refusal(block, message.block_size)
        if too_big:
            self.options.block_size = 0
            self.chat.add_note(f"{too_big}. Using the draft's own, {message.block_size}.", "warning")
        self.meter.set_settings(self.meter_settings())
        if pending is not None and pending.remember:
            self._remember_pair(message.target, message.draft)

    def _remember_pair(self, target: str, draft: Optional[str]) -> None:
        try:
            save_settings(self.loaded_config, model=target, draft=draft or "")
        except (PermissionError, OSError) as exc:
            self.notify(f"the model choice was not saved: {exc}", severity="warning")

    @while_shown
    def on_engine_failed(self, message: msg.EngineFailed) -> None:
        self.chat.hide_loading()
        self._pending_load = self._session_after_load = None
        self.notify(message.message, title="model not loaded", severity="error", timeout=10)
        if message.kept and self.target_name:
            self.model_state = "ready"
            self.chat.add_note(f"Could not load {message.model}: {message.message}", "error")
            kept = model_label(self.target_name)  # names, never install paths
            if self.draft_name:
                draft = draft_label(self.target_name, self.draft_name)
                kept += f" with {draft}" if draft == "its draft" else f" with draft {draft}"
            self.chat.add_note(f"Still on {kept}; the conversation goes on.")
            return
        self.model_state = "failed"
        self.target_name = self.draft_name = None
        self.chat.add_note(f"Could not load the model. {message.message}", "error")
        self.chat.add_note("Pick another one with F3 or /model.")
        self.meter.reset_pair()
        self.meter.set_pair(None, None, "no model")

    @while_shown
    def on_baseline_measured(self, message: msg.BaselineMeasured) -> None:
        self.baseline_tps = message.tokens_per_second
        self.meter.set_baseline_tps(message.tokens_per_second)

    @while_shown
    def on_probe_measured(self, message: msg.ProbeMeasured) -> None:
        if not self._probe_ran_another_size():
            self.meter.set_probe_tps(message.tokens_per_second)

    def _probe_ran_another_size(self) -> bool:
        """A server's probe ran at its own block size; one chosen here that differs is not what it measured
        (as a local probe's figure goes on a new /block)."""
        server = self.server
        chosen = self.generation_settings().get("block_size") if server is not None else None
        if chosen is None:  # the server's own size applies: the one its probe ran
            return False
        own = server.block_size or None
        return (chosen or own) != (server.default_block or own)

    @while_shown
    def on_sizer_plan(self, message: msg.SizerPlan) -> None:
        self.meter.set_sizer_plan(message.next_block)
