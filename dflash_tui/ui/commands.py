"""Slash commands typed in the prompt, the command palette's entries, and the help screen."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Optional, Protocol

from textual.app import ComposeResult
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from dflash_tui.config import VALIDATORS, BadValue


class ChatControls(Protocol):
    """What the slash commands and the palette ask of the chat app (the app is never imported here)."""

    baseline: bool
    generating: bool  # a reply is streaming
    prompt: Any  # the prompt box (a TextArea with a `value`)
    draft_block_size: int  # the loaded draft's own block size (0: none loaded)
    theme: str
    available_themes: dict[str, Any]

    def notify(self, message: str, *, title: str = "", severity: Any = "information",
               timeout: Optional[float] = None, markup: bool = False) -> None: ...
    def action_new_chat(self) -> None: ...
    def action_regenerate(self) -> None: ...
    def action_stop(self) -> None: ...
    def action_pick_model(self) -> None: ...
    def action_sessions(self) -> None: ...
    def action_copy_reply(self) -> None: ...
    def action_copy_code(self) -> None: ...
    def action_help(self) -> None: ...
    def search_themes(self) -> None: ...
    def set_system_prompt(self, text: str) -> None: ...
    def describe_setting(self, key: str) -> str: ...
    def refuse_setting(self, key: str, value: Any) -> Optional[str]: ...
    def change_setting(self, key: str, value: Any) -> None: ...
    def set_baseline(self, on_: bool) -> None: ...
    def load_model(self, model: str, draft: Optional[str] = None, remember: bool = False,
                   keep_chat: bool = False) -> None: ...
    def save_session(self, announce: bool = True) -> None: ...
    def export_conversation(self, path: Optional[str]) -> None: ...
    async def branch_from_palette(self, what: str, step: int = 0) -> None: ...


@dataclass(frozen=True)
class SlashCommand:
    name: str
    args: str
    help: str
    run: Callable[[ChatControls, str], Awaitable[None]]


# -- handlers: each gets the app and the text after the command name ---------
async def _new(app: ChatControls, arg: str) -> None:
    app.action_new_chat()


async def _system(app: ChatControls, arg: str) -> None:
    app.set_system_prompt(arg)


def _setting(key: str, label: str) -> Callable[[ChatControls, str], Awaitable[None]]:
    async def run(app: ChatControls, arg: str) -> None:
        if not arg:
            app.notify(f"{label} is {app.describe_setting(key)}", title=f"/{_NAME_OF[key]}")
            return
        try:
            value = VALIDATORS[key](arg)
        except BadValue as exc:
            words = str(exc)
            if key == "block_size":  # one rule in the same words everywhere (--block-size, serve, /block 17)
                from dflash_tui.commands.common import block_size_problem

                problem = block_size_problem(arg, "/baseline runs the target alone", app.draft_block_size)
                words = f"{arg.strip()[:20]} refused: {problem}"
            app.notify(f"{label} {words}", title=f"/{_NAME_OF[key]}", severity="error")
            return
        refused = app.refuse_setting(key, value)
        if refused:
            app.notify(refused, title=f"/{_NAME_OF[key]}", severity="error")
            return
        app.change_setting(key, value)

    return run


async def _baseline(app: ChatControls, arg: str) -> None:
    if arg:
        try:
            value = VALIDATORS["trust_remote_code"](arg)  # the same on/off parser
        except BadValue as exc:
            app.notify(f"/baseline {exc}", severity="error")
            return
    else:
        value = not app.baseline
    app.set_baseline(value)


async def _model(app: ChatControls, arg: str) -> None:
    parts = arg.split()
    if not parts:
        app.action_pick_model()
    elif len(parts) > 2:
        app.notify("usage: /model [MODEL [DRAFT]]", severity="error")
    else:
        app.load_model(parts[0], parts[1] if len(parts) > 1 else None, remember=True)


async def _theme(app: ChatControls, arg: str) -> None:
    if not arg:
        app.search_themes()
        return
    if arg not in app.available_themes:
        close = difflib.get_close_matches(arg, list(app.available_themes), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        app.notify(f"no theme named '{arg}'{hint}", severity="error")
        return
    app.theme = arg


async def _save(app: ChatControls, arg: str) -> None:
    app.save_session(announce=True)


async def _export(app: ChatControls, arg: str) -> None:
    app.export_conversation(arg or None)


async def _help(app: ChatControls, arg: str) -> None:
    app.action_help()


async def _retry(app: ChatControls, arg: str) -> None:
    app.action_regenerate()


COMMANDS: list[SlashCommand] = [
    SlashCommand("new", "", "start a new conversation", _new),
    SlashCommand("system", "[TEXT]", "set the system prompt; no text clears it", _system),
    SlashCommand("temp", "[T]", "sampling temperature (0 = greedy)", _setting("temperature", "temperature")),
    SlashCommand("top-p", "[P]", "nucleus sampling: keep the top tokens up to probability P", _setting("top_p", "top-p")),
    SlashCommand("top-k", "[K]", "sample from the K likeliest tokens only (0 = no limit)", _setting("top_k", "top-k")),
    SlashCommand("min-p", "[P]", "drop tokens less likely than P times the likeliest (0 = off)", _setting("min_p", "min-p")),
    SlashCommand("block", "[N|auto]", "DFlash block size, at most the draft's own (auto = adaptive, 0 = the draft's own)",
                 _setting("block_size", "block size")),
    SlashCommand("max-tokens", "[N]", "longest reply, in tokens", _setting("max_tokens", "max tokens")),
    SlashCommand("baseline", "[on/off]", "toggle target-only decoding, for A/B against DFlash", _baseline),
    SlashCommand("model", "[MODEL [DRAFT]]", "load another pair; no argument opens the picker", _model),
    SlashCommand("theme", "[NAME]", "switch theme; no name opens the theme picker", _theme),
    SlashCommand("save", "", "save the session now (it is also saved after every reply)", _save),
    SlashCommand("export", "[PATH]", "write the conversation as Markdown", _export),
    SlashCommand("retry", "", "regenerate the last reply", _retry),
    SlashCommand("help", "", "commands and keys", _help),
]
BY_NAME = {c.name: c for c in COMMANDS}
_NAME_OF = {"temperature": "temp", "top_p": "top-p", "top_k": "top-k", "min_p": "min-p", "block_size": "block",
            "max_tokens": "max-tokens"}


def parse(text: str) -> Optional[tuple[str, str]]:
    """'/temp 0.7' -> ('temp', '0.7'); None when the text is not a command."""
    text = text.strip()
    if not text.startswith("/") or text.startswith("//") or len(text) < 2:
        return None
    name, _, arg = text[1:].partition(" ")
    return name.lower(), arg.strip()


async def run_slash(app: ChatControls, text: str) -> bool:
    """Run a slash command; returns False when `text` is not one (send it as a message)."""
    parsed = parse(text)
    if parsed is None:
        return False
    name, arg = parsed
    command = BY_NAME.get(name)
    if command is None:
        close = difflib.get_close_matches(name, list(BY_NAME), n=1)
        hint = f" — did you mean /{close[0]}?" if close else " — /help lists them"
        app.notify(f"unknown command /{name}{hint}", severity="error")
        return True
    await command.run(app, arg)
    return True


def slash_suggestions() -> list[str]:
    return [f"/{c.name}" for c in COMMANDS]


# -- the command palette ------------------------------------------------------
# slash commands that take a value: the palette puts "/name " in the prompt for the user to finish
_TYPED_IN_PROMPT = (
    ("Set block size…", "block", "DFlash block size: type N (at most the draft's own) or auto"),
    ("Set temperature…", "temp", "Sampling temperature: type T (0 = greedy)"),
    ("Set top-p…", "top-p", "Nucleus sampling: type P"),
    ("Set top-k…", "top-k", "Sample from the K likeliest tokens: type K (0 = no limit)"),
    ("Set min-p…", "min-p", "Drop tokens less likely than P times the likeliest: type P (0 = off)"),
    ("Set max tokens…", "max-tokens", "Longest reply, in tokens: type N"),
    ("Set the system prompt…", "system", "Type the system prompt (nothing clears it)"),
    ("Export conversation to…", "export", "Type the Markdown file's path"),
)


def _run_command(app: ChatControls, name: str, arg: str) -> Callable[[], Awaitable[None]]:
    return lambda: BY_NAME[name].run(app, arg)


def _type_in_prompt(app: ChatControls, name: str) -> Callable[[], None]:
    def run() -> None:
        app.prompt.value = f"/{name} "
        app.prompt.focus()

    return run


class DFlashProvider(Provider):
    """dflash-tui's own entries in the command palette (ctrl+p)."""

    def _entries(self) -> list[tuple[str, str, Callable[[], object]]]:
        app: ChatControls = self.app  # type: ignore[assignment]
        stop = [("Stop generation", "Stop the reply that is streaming (Esc)", app.action_stop)]
        return [
            ("New conversation", "Start over with the same model", app.action_new_chat),
            ("Regenerate last reply", "Ask the model for the last reply again", app.action_regenerate),
            *(stop if app.generating else []),  # only while a reply streams
            ("Toggle baseline", "Target-only decoding on/off, to compare with DFlash", lambda: app.set_baseline(not app.baseline)),
            ("Load a model", "Pick a target/draft pair (F3)", app.action_pick_model),
            ("Sessions", "Open, replay, rename or delete saved sessions", app.action_sessions),
            ("Edit message", "Edit the focused (or your last) message; Enter forks the conversation there (e)",
             lambda: app.branch_from_palette("edit")),
            ("Previous sibling", "The previous version of the focused (or last) message marked ‹ 2/3 › ([)",
             lambda: app.branch_from_palette("sibling", -1)),
            ("Next sibling", "The next version of the focused (or last) message marked ‹ 2/3 › (])",
             lambda: app.branch_from_palette("sibling", 1)),
            ("Delete message pair", "Delete the focused (or your last) message and its reply, asking first (d)",
             lambda: app.branch_from_palette("delete_pair")),
            ("Copy last reply", "Copy the last assistant message", app.action_copy_reply),
            ("Copy code from last reply", "Copy the code blocks of the last assistant message", app.action_copy_code),
            ("Save session", "Write the session file now (/save)", lambda: app.save_session(announce=True)),
            ("Export conversation", "Write the conversation as Markdown (/export)",
             lambda: app.export_conversation(None)),
            ("Block size: auto", "Adaptive DFlash block size (/block auto)", _run_command(app, "block", "auto")),
            ("Block size: the draft's own", "The block size the draft was trained with (/block 0)",
             _run_command(app, "block", "0")),
            *[(title, f"{what} (/{name})", _type_in_prompt(app, name)) for title, name, what in _TYPED_IN_PROMPT],
            ("Help", "Slash commands and keys", app.action_help),
        ]

    async def discover(self) -> Hits:
        for title, help_text, callback in self._entries():
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._entries():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)


# -- help ----------------------------------------------------------------------
def help_markdown(keys: Iterable[tuple[str, str]]) -> str:
    lines = ["# dflash-tui", "", "Type a message and press **Enter**; **shift+enter**, **alt+enter** or **ctrl+j** "
             "start a new line (terminals differ in which they pass on). A message starting with `/` is a command "
             "(`//` sends a literal `/`), also while you edit a message (`e`): the command runs and the edit stays, "
             "the message's text back in the prompt (Enter forks, Esc cancels), unless the command took the "
             "message away (`/new` cancels the edit).", "", "A paste keeps every line; a control character in it "
             "(ESC, from coloured terminal output) is kept as its symbol (␛), which is what is sent.",
             "", "## Keys", ""]
    lines += [f"- `{key}` — {what}" for key, what in keys]
    lines += ["", "ctrl+l is not used (it clears the screen in a shell), nor ctrl+m, ctrl+i, ctrl+h (Enter, Tab, "
              "Backspace in most terminals).", "", "## Commands", ""]
    for c in COMMANDS:
        lines.append(f"- `/{c.name}{(' ' + c.args) if c.args else ''}` — {c.help}")
    lines += ["", "Settings changed with commands last for this run; the theme and a model picked in the app "
              "are remembered in config.toml."]
    return "\n".join(lines)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,f1", "dismiss", "Close")]

    def __init__(self, keys: Iterable[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Markdown(help_markdown(self.keys))

    def action_dismiss(self) -> None:
        self.dismiss(None)
