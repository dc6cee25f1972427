"""The dflash-tui app: conversation, acceptance view, system meter, prompt, footer.

The app only reacts to Messages from the engine worker (ui/worker.py), which
owns the models in its own thread; nothing here calls MLX.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from textual import events, on
from textual.app import App, ComposeResult, SuspendNotSupported
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer

from dflash_tui.config import Config, LoadedConfig, load_config
from dflash_tui.ui import messages as msg
from dflash_tui.ui.messages import while_shown
from dflash_tui.ui.acceptance import AcceptanceView
from dflash_tui.ui.branching import Branching, reply_for
from dflash_tui.ui.chat_view import ChatView
from dflash_tui.ui.commands import DFlashProvider, HelpScreen, run_slash, slash_suggestions
from dflash_tui.ui.editor import edit_text
from dflash_tui.ui.keys import app_bindings, help_rows, read_alt_enter_as_new_line
from dflash_tui.ui.meter import SystemMeter
from dflash_tui.ui.model_picker import ModelPicker
from dflash_tui.engine.block_limit import refusal
from dflash_tui.ui.pair_loading import PairLoading
from dflash_tui.ui.pane_switch import PaneSwitching
from dflash_tui.ui.paste_parser import read_pastes_whole
from dflash_tui.ui.plain_notify import PlainNotify
from dflash_tui.ui.prompt import PromptBox
from dflash_tui.ui.leaving import SessionSaving
from dflash_tui.ui.themes import ThemeKeeping
from dflash_tui.ui.turns import TurnStreaming
from dflash_tui.ui.worker import EngineWorker, NewConversation, Restore, SetSystem

PANE_REPAINT_S = 0.5  # while a reply streams, the figures and the meter repaint at most this often
_SETTING_LABELS = {"temperature": "temperature", "top_p": "top-p", "top_k": "top-k", "min_p": "min-p",
                   "block_size": "block size", "max_tokens": "max tokens"}


class DFlashApp(PairLoading, Branching, TurnStreaming, SessionSaving, ThemeKeeping, PaneSwitching, PlainNotify,
                App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "dflash-tui"
    COMMANDS = App.COMMANDS | {DFlashProvider}
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    # -tiny: too few rows for the side panes and a conversation both: the conversation keeps them
    VERTICAL_BREAKPOINTS = [(0, "-tiny"), (18, "-short"), (36, "-tall")]
    BINDINGS = app_bindings()  # ui/keys.py: one table for the bindings and the F1 help

    def __init__(
        self,
        model: Optional[str] = None,
        draft: Optional[str] = None,
        trust_remote_code: Optional[bool] = None,
        config: Optional[LoadedConfig] = None,
        start_engine: bool = True,
        probe_tokens: Optional[int] = None,
        remote: Optional[Any] = None,
        theme: Optional[str] = None,
    ) -> None:
        """`remote`: a RemoteTarget (remote/client.py): the engine is that server's, not MLX here.
        `theme`: this run's (--theme), never written to config.toml."""
        super().__init__()
        read_alt_enter_as_new_line()
        read_pastes_whole(self.driver_class)  # a paste holding an ESC arrives whole (ui/paste_parser.py)
        self.loaded_config = config or load_config()
        cfg = self.loaded_config.config
        self.options = Config(**cfg.to_dict())  # this run's settings: slash commands change these, not the file
        self.options.theme = theme or self.options.theme
        # the block size the app put in options for the pair (PairLoading.block_for); None once it is the user's
        self.block_default = None if "block_size" in self.loaded_config.given else self.options.block_size
        self._initial = (model or cfg.model or None, draft or (cfg.draft if not model else None) or None)
        self.trust_remote_code = cfg.trust_remote_code if trust_remote_code is None else trust_remote_code
        self.probe_tokens = cfg.baseline_probe_tokens if probe_tokens is None else probe_tokens
        self.start_engine = start_engine
        self.remote = remote
        self.server = None  # the remote engine's ServerInfo, once connected
        if remote is not None:
            from dflash_tui.ui.remote_worker import RemoteWorker

            self.engine = RemoteWorker(self.post_message, remote)
            self._initial = (remote.model or remote.url, None)
        else:
            self.engine = EngineWorker(self.post_message)
        self.baseline = False
        self.system_prompt = cfg.system or ""
        self._system_after_turn: Optional[str] = None  # a /system set while a reply streamed, recorded after it
        self.model_state = "none"  # none | loading | ready | failed
        self.target_name: Optional[str] = None
        self.draft_name: Optional[str] = None
        self.draft_block_size = 0
        self.device: Optional[str] = None
        self.decoder = None  # token id -> text, from the loaded tokenizer
        self.baseline_tps: Optional[float] = None
        self.init_turns()
        self._pending_load = None  # a PendingLoad while the engine loads a pair
        self._theme_save_timer = None
        self._theme_chosen = False  # the user changed the theme in this run: only then is it written
        self._session_after_load = None
        self.session = None
        self.session_store = None

    # -- layout ------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield ChatView(id="chat")
            with Vertical(id="side"):
                yield AcceptanceView(id="acceptance", figures_interval=PANE_REPAINT_S)
                yield SystemMeter(id="meter", repaint_interval=PANE_REPAINT_S)
        yield PromptBox(suggestions=slash_suggestions(), id="prompt")
        yield Footer()

    # the chat's own widgets, even while a replay screen with its own ChatView is in front
    @property
    def main_screen(self):
        return self.screen_stack[0]

    pane_screen = main_screen  # where the side panes' classes go (ui/pane_switch.py)

    @property
    def chat(self) -> ChatView:
        return self.main_screen.query_one("#chat", ChatView)

    @property
    def acceptance(self) -> AcceptanceView:
        return self.main_screen.query_one("#acceptance", AcceptanceView)

    @property
    def meter(self) -> SystemMeter:
        return self.main_screen.query_one("#meter", SystemMeter)

    @property
    def prompt(self) -> PromptBox:
        return self.main_screen.query_one(PromptBox)

    def on_mount(self) -> None:
        self._setup_themes()
        self.chat.border_title = "conversation"
        self.fit_panes(self.size.width)  # and on each resize: under 64 columns one pane, f4 the other
        if self.loaded_config.message:
            self.chat.add_note(self.loaded_config.message, "warning")
            self.notify(self.loaded_config.message, title="config.toml", severity="warning", timeout=10)
        if self.system_prompt:
            self.chat.add_system(self.system_prompt)
        self.meter.set_settings(self.meter_settings())
        self.meter.set_baseline_tps(None)
        if self.start_engine:
            self.engine.start(self)
            model, draft = self._initial
            if model:
                self.load_model(model, draft)
            else:
                self.chat.add_note("No model loaded yet. Pick one (F3), or start with --model M --draft D, or --demo.")
                self.call_after_refresh(self.action_pick_model)
        self.prompt.focus()

    def on_resize(self, event: events.Resize) -> None:
        self.fit_panes(event.size.width)  # app.tcss: under 64 columns the pane or the meter alone (ui/pane_switch.py)

    async def on_unmount(self) -> None:
        self._save_theme()
        await self.engine.stopped()  # the engine thread ends (and frees MLX) before the interpreter does

    # -- settings ----------------------------------------------------------
    def generation_settings(self) -> dict[str, Any]:
        """Keyword arguments for the engine's GenerationSettings. A remote engine gets no block size where
        the user chose none (the server's own --block-size applies), and 0 for the draft's own."""
        settings = {**self.options.generation(), "baseline": self.baseline}
        if self.server is not None:
            chosen = self.block_default is None or self.options.block_size != self.block_default
            settings["block_size"] = self.options.block_size if chosen else None  # 0 stays 0 here
        return settings

    def acceptance_mode(self) -> str:
        """What the next reply's cycles are: "dflash", or "baseline" (the target alone, nothing drafted)."""
        if self.server is not None and self.server.kind != "dflash":
            return "remote"  # text only while it streams; the server's figures, if any, at the end
        return "baseline" if self.baseline or (self.model_state == "ready" and not self.draft_name) else "dflash"

    def meter_settings(self) -> dict[str, Any]:
        s = self.generation_settings()
        servers_own = self.server is not None and s["block_size"] is None  # remote, none chosen: the server's size
        s["block_size"] = 1 if self.baseline else (self.options.block_size or self.draft_block_size or None)
        if servers_own and not self.baseline:
            s["block_size"] = self.server.default_block or s["block_size"]
        s["max_block"] = self.draft_block_size
        s["mode"] = "baseline" if self.baseline else "dflash"
        return s

    def describe_setting(self, key: str) -> str:
        value = getattr(self.options, key)
        if key == "block_size" and value == "auto":
            return "auto (adaptive, up to the draft's own)"
        if key == "block_size" and value == 0:
            return f"0 (the draft's own: {self.draft_block_size})" if self.draft_block_size else "0 (the draft's own)"
        if key == "temperature" and value == 0:
            return "0 (greedy)"
        return f"{value:g}" if isinstance(value, float) else str(value)

    def refuse_setting(self, key: str, value: Any) -> Optional[str]:
        """Why a valid value cannot be used with the pair loaded now; None when it can."""
        if key != "block_size" or not isinstance(value, int) or value == 0 or self.model_state != "ready":
            return None
        if not self.draft_name:
            return "there is no draft: the target runs alone, with no block to size"
        return refusal(value, self.draft_block_size)

    def change_setting(self, key: str, value: Any) -> None:
        if key == "block_size" and (value or self.draft_block_size) != (self.options.block_size or self.draft_block_size):
            self.meter.set_probe_tps(None)  # the probe ran the size in force at load: not this one
        setattr(self.options, key, value)
        if key == "block_size":
            self.block_default = None
        self.meter.set_settings(self.meter_settings())
        note = " (from the next reply)" if self.generating else ""
        self.notify(f"{_SETTING_LABELS.get(key, key)} set to {self.describe_setting(key)}{note}", timeout=3)

    def set_baseline(self, on_: bool) -> None:
        self.baseline = on_
        self.meter.set_settings(self.meter_settings())
        self.notify("baseline on: the target alone decodes, for A/B" if on_ else "baseline off: DFlash decoding",
                    timeout=3)

    def set_system_prompt(self, text: str) -> None:
        self.system_prompt = text
        self.engine.submit(SetSystem(text or None))
        if text:
            self.chat.add_system(text)
        else:
            self.chat.add_note("System prompt cleared.")
        if self.session is not None and self.session.messages:  # kept where it was set, like any message
            if self.generating:
                self._system_after_turn = text  # the reply streaming now was written without it
                return
            self.session.add_message("system", text, None)
            self.save_session(announce=False)

    @while_shown
    def on_memory_sample(self, message: msg.MemorySample) -> None:
        self.meter.set_memory(message.active_bytes, message.peak_bytes, message.rss_bytes)

    @while_shown
    def on_engine_notice(self, message: msg.EngineNotice) -> None:
        self.notify(message.text, severity=message.severity)  # type: ignore[arg-type]

    # -- turns ---------------------------------------------------------------
    @on(PromptBox.Send)
    async def _send(self, event: PromptBox.Send) -> None:
        if await run_slash(self, event.text):
            self.end_edit_if_gone()  # a command typed while editing leaves the edit pending (ui/branching.py)
            return
        text = event.text[1:] if event.text.startswith("//") else event.text  # '//' sends a literal '/'
        if not self._can_start():
            self.prompt.value = event.text  # nothing is lost
            return
        self.start_turn(text)

    def _can_start(self) -> bool:
        if self.generating:
            self.notify("A reply is still streaming; Esc stops it", severity="warning")
        elif self.model_state == "loading":
            self.notify("The model is still loading", severity="warning")
        elif self.model_state != "ready":
            self.notify("No model is loaded; pick one with F3 or /model", severity="warning")
        else:
            return True
        return False

    # -- actions -------------------------------------------------------------
    _CHAT_ACTIONS = {"stop", "regenerate", "new_chat", "pick_model", "sessions", "copy_reply", "toggle_panes", "help",
                     "switch_pane"}

    def check_action(self, action: str, parameters: tuple[object, ...]) -> Optional[bool]:
        if action in self._CHAT_ACTIONS and self.screen is not self.main_screen:
            return False  # another screen (replay, sessions, a picker) is in front: its keys, not the chat's
        if action == "stop":
            return self.generating  # shown (and live) only while a reply streams
        if action == "switch_pane":
            return self.can_switch_pane()
        return True

    def action_stop(self) -> None:
        if self.generating:
            self._submit_turn()  # Esc before the engine got the turn: it starts and stops at once
            self.engine.cancel()
            self.notify("Stopped" if self.server is not None else "Stopping after this cycle…", timeout=2)

    def action_regenerate(self) -> None:
        if not self._can_start():
            return
        last = self.chat.last_assistant()
        if last is None:
            self.notify("There is no reply to regenerate yet", severity="warning")
            return
        last.remove()
        self.start_turn(None)

    def action_new_chat(self) -> None:
        if self.generating:
            self.notify("A reply is streaming; press Esc to stop it first", severity="warning")
            return
        self.leave_conversation(lambda: self.call_later(self._new_chat))

    async def _new_chat(self) -> None:
        await self.chat.clear()
        self.engine.submit(NewConversation(self.system_prompt or None))
        self.acceptance.reset(self.acceptance_mode())
        self.session = None
        if self.system_prompt:
            self.chat.add_system(self.system_prompt)
        self.chat.add_note("New conversation.")
        self.end_edit_if_gone()  # a message being edited went with the conversation (it may come after /new's own check)
        self.prompt.focus()

    def action_pick_model(self) -> None:
        from dflash_tui.ui.model_sources import is_url
        from dflash_tui.ui.remote_worker import switch_to_remote

        def picked(choice: Optional[tuple[str, Optional[str]]]) -> None:
            if not choice:
                return
            if self.remote is None and is_url(choice[0]):  # a server: the engine moves there
                self.leave_conversation(lambda: self.call_later(switch_to_remote, self, choice[0]))
            else:  # with a remote engine, one of its server's models: nothing loads here
                self.leave_conversation(lambda: self.load_model(choice[0], choice[1], remember=self.remote is None))

        configured = (self.options.remote or None) if self.remote is None else None
        self.push_screen(ModelPicker(self.target_name, current_draft=self.draft_name, server=self.remote,
                                     remote_url=configured), picked)

    def action_sessions(self) -> None:
        from dflash_tui.ui.sessions_screen import SessionsScreen

        self.push_screen(SessionsScreen(), self._session_chosen)

    def _session_chosen(self, result: Optional[tuple[str, Any]]) -> None:
        if not result:
            return
        what, session = result
        if what == "replay":
            from dflash_tui.ui.replay_screen import ReplayScreen

            self.push_screen(ReplayScreen(session))
        elif what == "open":
            self.leave_conversation(lambda: self.call_later(self.open_session, session))

    async def open_session(self, session: Any) -> None:
        """Continue a saved conversation: show it, hand its messages to the engine."""
        if self.generating:
            self.notify("A reply is streaming; press Esc to stop it first", severity="warning")
            return
        from dflash_tui.ui.session_engine import continued_here, elsewhere_note, ran_elsewhere

        saved, here = session, (self.server.url if self.server is not None else None)
        elsewhere = ran_elsewhere(saved, here)  # its model name means nothing to the engine in use
        if elsewhere:
            session = continued_here(self._store(), saved, self.target_name or "", self.draft_name,
                                     self.generation_settings(), self.device, here)
        messages = session.conversation()
        await self.chat.clear()
        memory = (self.meter.state.active_bytes, self.meter.state.peak_bytes, self.meter.state.rss_bytes)
        self.meter.reset_turns(keep_speedup=True)  # the conversation's figures go; a new pair resets the rest
        self.meter.set_memory(*memory)  # the process's, not the conversation's
        self.render_messages(session, session.messages)  # each with its id and versions (ui/branching.py)
        # another engine's token ids mean nothing to this tokenizer: its cycles are for its replay
        self.show_trace(None if elsewhere else reply_for(session.messages, None))
        self.system_prompt = session.system_prompt()
        ends = session.title.rstrip().endswith((".", "!", "?", "…", "。", "！", "？"))  # its own stop: no second one
        self.chat.add_note(f"Opened session “{session.title}”" + ("" if ends else "."))
        if elsewhere:
            self.chat.add_note(elsewhere_note(saved, self.target_name, here))
        same_draft = self.remote is not None or (session.draft or None) == self.draft_name
        if elsewhere:
            self.session = session
            session.decoder = self.decoder
        elif session.target != self.target_name or not same_draft or self.model_state != "ready":
            self._session_after_load = session
            self.load_model(session.target, session.draft, keep_chat=True)
        else:
            self.session = session
            session.decoder = self.decoder  # new replies record their tokens' text
        self.engine.submit(Restore(messages))  # queued after the load, so it lands in the new conversation

    def action_copy_reply(self) -> None:
        focused = self.focused
        from dflash_tui.ui.chat_view import MessageBlock

        target = focused if isinstance(focused, MessageBlock) else self.chat.last_assistant()
        if target is None:
            self.notify("Nothing to copy yet", severity="warning")
            return
        target.action_copy_message()

    def action_copy_code(self) -> None:
        last = self.chat.last_assistant()
        if last is None:
            self.notify("Nothing to copy yet", severity="warning")
            return
        last.action_copy_code()

    def action_toggle_panes(self) -> None:
        self.screen.toggle_class("-chat-only")

    def action_help(self) -> None:
        self.push_screen(HelpScreen(help_rows()))

    @on(PromptBox.ComposeRequested)
    def _compose_in_editor(self) -> None:
        """ctrl+e: the editor gets the terminal, the prompt gets its text back (sent with Enter, as typed)."""
        prompt = self.prompt
        try:
            with self.suspend():
                edited = edit_text(prompt.value)
        except SuspendNotSupported:
            self.notify("this terminal cannot be handed to an editor", severity="warning")
            return
        if edited.problem:
            self.notify(edited.problem, title="editor", severity="error")
        elif edited.text is not None:
            prompt.value = edited.text
        prompt.focus()

    # -- sessions --------------------------------------------------------------
    def _store(self):
        if self.session_store is None:
            from dflash_tui.sessions import SessionStore

            self.session_store = SessionStore()
        return self.session_store

    def _record_turn(self, reply: str) -> None:
        try:
            store = self._store()
            if self.session is None:
                self.session = store.new(self.target_name or "", self.draft_name, self._turn_settings,
                                         device=self.device, decoder=self.decoder,
                                         server=self.server.url if self.server is not None else None)
                if self.system_prompt:
                    self.session.add_message("system", self.system_prompt, None)
            if self._turn_edit is not None:  # an edited message: a fork beside the one it replaces
                self.session.edit(self._turn_edit, self._turn_user_text)
                self.session.add_message("assistant", reply, list(self._recorder.trace))
            elif self._turn_user_text is not None:
                self.session.add_message("user", self._turn_user_text, None)
                self.session.add_message("assistant", reply, list(self._recorder.trace))
            else:  # regenerated: a sibling of the reply in view, which the session keeps
                self.session.regenerate_reply(reply, list(self._recorder.trace))
            if self._system_after_turn is not None:
                self.session.add_message("system", self._system_after_turn, None)
                self._system_after_turn = None
            self.session.settings = dict(self._turn_settings)  # the file's settings: its last reply's
            if self.baseline_tps:
                self.session.baseline_tps = self.baseline_tps
        except Exception as exc:  # recording must never break the chat
            self.notify(f"the session could not be recorded: {exc}", severity="error")
            return
        self.save_session(announce=False)
        self.label_turn()

    def export_conversation(self, path: Optional[str]) -> None:
        """Markdown (or JSON, for a path ending in .json) through the session store's exporter."""
        if self.session is None or not self.session.messages:
            self.notify("Nothing to export yet", severity="warning")
            return
        fmt = "json" if path and path.lower().endswith(".json") else "markdown"
        try:
            out = self._store().export(self.session, fmt, Path(path) if path else None)
        except OSError as exc:
            self.notify(f"could not export: {exc}", severity="error")
            return
        self.notify(f"Exported to {out}", timeout=5)


def run_app(model: Optional[str], draft: Optional[str], trust_remote_code: Optional[bool] = None) -> None:
    DFlashApp(model=model, draft=draft, trust_remote_code=trust_remote_code).run()
