"""The conversation: user and assistant messages, notes, and the loading panel.

Assistant replies stream in two parts: the Markdown, which takes whole lines at
most every MARKDOWN_INTERVAL_S and a code block only once it is closed, and a
plain-text tail under it with the newer text (an open code block shaped like
one), updated on every batch. Parsing and highlighting a growing code block
costs more the longer it gets, and the UI thread competes with the engine for
the GIL; the tail costs almost nothing. So each code block is parsed and
highlighted about once while it streams, and a reply that is all code (bare
source, as the demo model writes) is parsed once, at the end: the reply gets
one full Markdown update then, the plain Markdown of the whole text. The view is
anchored: it follows the stream while the user is at the bottom and stays put
once they scroll up (Textual restores the anchor when they scroll back).
"""

from __future__ import annotations

import asyncio
import time
from typing import Optional

from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message as TextualMessage
from textual.widget import AwaitMount
from textual.widgets import Label, Markdown, ProgressBar, Static

from dflash_tui.ui.keys import message_bindings
from dflash_tui.ui.reply_text import (FENCE_LINE, code_blocks, display_text, has_fence_line, looks_like_bare_code,
                                       open_fence_start, start_undecided, visible)

# the app can only ask the terminal (OSC 52): it cannot know whether the terminal did it
CLIPBOARD_NOTE = "went to the terminal's clipboard (OSC 52; some terminals ignore it, tmux needs set-clipboard on)"
MARKDOWN_INTERVAL_S = 1.0  # while a reply streams, its Markdown is re-parsed at most this often


CLEARED = "(system prompt cleared)"  # an empty system message: /system with no text

class MessageHeader(Static):
    """The role line; its copy links act on the message it heads."""

    def action_copy_message(self) -> None:
        if isinstance(self.parent, MessageBlock):
            self.parent.action_copy_message()

    def action_copy_code(self) -> None:
        if isinstance(self.parent, MessageBlock):
            self.parent.action_copy_code()

    def action_previous_version(self) -> None:
        if isinstance(self.parent, MessageBlock):
            self.parent.action_previous_version()

    def action_next_version(self) -> None:
        if isinstance(self.parent, MessageBlock):
            self.parent.action_next_version()


class MessageBlock(Vertical, can_focus=True):
    """One message. Focus it (click or tab) and press c to copy it, y for its code.

    A message of the session (`message_id` set) also answers to the branch keys: `e` edits a
    message you wrote, `[` / `]` show its other versions (`‹ 2/3 ›` in the header), `d` deletes it
    and its reply. Each posts a `BranchRequest` for the app to act on.
    """

    BINDINGS = message_bindings()
    ROLE = "message"
    COPIED = "The message"  # what the copy toast calls it, in a sentence (ROLE is the header's word and CSS class)
    EDITABLE = False

    class BranchRequest(TextualMessage):
        """`what`: "edit", "sibling" (`step` -1 or +1) or "delete_pair", on the session's message `message_id`."""

        def __init__(self, message_id: str, what: str, step: int = 0) -> None:
            super().__init__()
            self.message_id = message_id
            self.what = what
            self.step = step

    def __init__(self, text: str = "", message_id: Optional[str] = None,
                 versions: Optional[tuple[int, int]] = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.raw_text = text
        self.message_id = message_id  # the session's id for it; None: not saved (yet), or a replay
        self.versions = versions  # (position, count) among its versions
        self.add_class(f"-{self.ROLE}")

    @property
    def _focus_sort_key(self) -> tuple[int, int]:
        # Textual orders Tab by position: the lowest message first, so Tab from the prompt reaches the
        # latest message, then older ones, and shift+tab goes back towards the latest and the prompt
        y, x = super()._focus_sort_key
        return -y, x

    def header_text(self) -> str:
        # markup made of constants and numbers only: the message's own text never goes in here
        links = "[@click=copy_message]copy[/]"
        if code_blocks(display_text(self.raw_text)):
            links += "  [@click=copy_code]copy code[/]"
        label = ""
        if self.message_id is not None and self.versions and self.versions[1] > 1:
            at, count = self.versions
            label = f"  [@click=previous_version]‹[/] {int(at)}/{int(count)} [@click=next_version]›[/]"
        return f"[b]{self.ROLE}[/b]{label}  [dim]{links}[/dim]"

    def set_branch(self, message_id: Optional[str], versions: Optional[tuple[int, int]]) -> None:
        """The session's id for this message and its place among its versions; the header follows."""
        self.message_id, self.versions = message_id, versions
        self.refresh_header()
        self.refresh_bindings()

    def compose_header(self) -> MessageHeader:
        return MessageHeader(self.header_text(), classes="message-header")

    def refresh_header(self) -> None:
        for header in self.query(MessageHeader):
            header.update(self.header_text())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> Optional[bool]:
        if action == "edit":
            return self.EDITABLE and self.message_id is not None
        if action in ("sibling", "previous_version", "next_version"):
            return self.message_id is not None and bool(self.versions) and self.versions[1] > 1
        if action == "delete_pair":
            return self.message_id is not None and self.ROLE in ("you", "assistant")
        return True

    def action_edit(self) -> None:
        if self.message_id is not None:
            self.post_message(self.BranchRequest(self.message_id, "edit"))

    def action_previous_version(self) -> None:
        if self.message_id is not None:
            self.post_message(self.BranchRequest(self.message_id, "sibling", -1))

    def action_next_version(self) -> None:
        if self.message_id is not None:
            self.post_message(self.BranchRequest(self.message_id, "sibling", 1))

    def action_delete_pair(self) -> None:
        if self.message_id is not None:
            self.post_message(self.BranchRequest(self.message_id, "delete_pair"))

    def action_copy_message(self) -> None:
        self.app.copy_to_clipboard(self.raw_text)
        self.app.notify(f"{self.COPIED} ({len(self.raw_text)} characters) {CLIPBOARD_NOTE}", timeout=4)

    def action_copy_code(self) -> None:
        blocks = code_blocks(display_text(self.raw_text))
        if not blocks:
            self.app.notify("This message has no code blocks", severity="warning", timeout=2)
            return
        self.app.copy_to_clipboard("\n\n".join(blocks))
        self.app.notify(f"{len(blocks)} code block{'s' if len(blocks) > 1 else ''} {CLIPBOARD_NOTE}", timeout=4)


class UserMessage(MessageBlock):
    ROLE = "you"
    COPIED = "Your message"
    EDITABLE = True

    def compose(self) -> ComposeResult:
        yield self.compose_header()
        yield Static(visible(self.raw_text), markup=False, classes="message-body")


class SystemPromptMessage(MessageBlock):
    ROLE = "system"
    COPIED = "The system prompt"

    def compose(self) -> ComposeResult:
        yield self.compose_header()
        yield Static(visible(self.raw_text) if self.raw_text else CLEARED, markup=False, classes="message-body")


class AssistantMessage(MessageBlock):
    ROLE = "assistant"
    COPIED = "The reply"

    def __init__(self, text: str = "", footer: str = "", message_id: Optional[str] = None,
                 versions: Optional[tuple[int, int]] = None, **kwargs) -> None:
        super().__init__(text, message_id, versions, **kwargs)
        self._footer = footer
        self._initial = text  # not raw_text: a stream may append to that before we are composed
        self.tail_text = ""  # the streamed text shown under the Markdown, not parsed yet
        self._tail_lines = 0

    def compose(self) -> ComposeResult:
        yield self.compose_header()
        yield Markdown(visible(display_text(self._initial)), classes="message-body")
        yield Static("", classes="message-tail", markup=False)
        yield Static(self._footer, classes="message-footer", markup=False)

    @property
    def body(self) -> Markdown:
        return self.query_one(Markdown)

    @property
    def tail(self) -> Static:
        """The newest streamed text, not parsed as Markdown yet."""
        return self.query_one(".message-tail", Static)

    def show_tail(self, text: str, code: bool = False) -> None:
        """Show `text` under the Markdown: plain, or (`code`) as the body of a code block it opens."""
        tail = self.tail
        self.tail_text = text
        lines = text.count("\n") + 1 if code else -1  # code does not wrap: its height is its lines
        tail.update(text, layout=lines < 0 or lines != self._tail_lines)  # same height: a repaint, not a layout
        self._tail_lines = lines
        tail.set_class(code, "-code")
        tail.display = bool(text) or code

    def hide_tail(self) -> None:
        self._tail_lines = 0
        self.tail_text = ""
        self.tail.update("")
        self.tail.display = False

    def set_footer(self, text: str) -> None:
        self._footer = text
        for footer in self.query(".message-footer").results(Static):  # none once the message is gone
            footer.update(text)
            footer.display = bool(text)

    def on_mount(self) -> None:
        self.query_one(".message-footer").display = bool(self._footer)
        self.tail.display = False


class AssistantHandle:
    """Feeds one streaming reply. `append` is cheap and ordered; `finish` renders the whole text once.

    The Markdown gets whole lines at most every `markdown_interval` seconds; the text after them
    shows in the message's plain tail, so each batch costs a small text update, not a parse.
    With `markdown_interval=None` every append goes straight into the Markdown (a replay, which
    no engine waits on).
    """

    def __init__(self, message: AssistantMessage, mounted,
                 markdown_interval: Optional[float] = MARKDOWN_INTERVAL_S) -> None:
        self.message = message
        self.markdown_interval = markdown_interval
        self._mounted = asyncio.ensure_future(mounted)
        self._parts: list[str] = []
        self._display = ""  # the Markdown to show for what has streamed (bare code gets its fence)
        self._parsed = 0  # how much of _display the Markdown widget has
        # the first parse waits an interval too: in a reply's first second the tail alone is cheap to show
        self._parsed_at = time.monotonic()
        self._drain: Optional[asyncio.Task] = None
        self._started = False  # the reply's start is known to be prose or bare code
        self.finished = False

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def showing(self) -> bool:
        """Some of the reply is on show (its start is not held back any more)."""
        return bool(self._display)

    async def mounted(self) -> None:
        """Wait until the message and its parts are in the DOM."""
        await asyncio.shield(self._mounted)

    @property
    def markdown_source(self) -> str:
        """What the Markdown widget has been given so far (the rest is in the tail)."""
        return self._display[: self._parsed]

    def append(self, text: str) -> None:
        if not text or self.finished:
            return
        self._parts.append(text)
        self.message.raw_text = self.text
        if not self._started:
            start = self.text
            if start_undecided(start):
                return  # too little to tell prose from code yet
            self._started = True
            text = ("```python\n" if looks_like_bare_code(start) else "") + start
        self._display += visible(text)
        if self._drain is None or self._drain.done():
            self._drain = asyncio.create_task(self._write())

    async def written(self) -> None:
        """Wait until what was appended is on show (in the Markdown or the tail)."""
        if self._drain is not None and not self._drain.done():
            await asyncio.shield(self._drain)

    async def _write(self) -> None:
        await self._mounted
        while self.message.is_attached:  # text appended during a parse is seen on the next round
            cut = self._cut()
            chunk = self._display[self._parsed:cut]
            # prose waits out the interval; at a code block's edges (one that has just closed, or the
            # prose before one that has just opened) the parse is at once: about twice per block
            due = (time.monotonic() - self._parsed_at >= (self.markdown_interval or 0)
                   or has_fence_line(self._display[self._parsed:]))
            if not chunk or not due:
                self._show_tail()
                return
            self._parsed = cut
            self._parsed_at = time.monotonic()
            await self.message.body.append(chunk)  # re-parses from the last block only

    def _cut(self) -> int:
        """Where the Markdown may end: after the last whole line, and before a code block still open."""
        if self.markdown_interval is None:
            return len(self._display)
        cut = self._display.rfind("\n") + 1
        start = open_fence_start(self._display[:cut])
        return cut if start is None else start

    def _show_tail(self) -> None:
        if self.markdown_interval is None:
            return  # everything is in the Markdown
        tail = self._display[self._parsed:]
        first, newline, rest = tail.partition("\n")
        if newline and FENCE_LINE.fullmatch(first):
            self.message.show_tail(rest, code=True)  # an open code block: its fence line drawn as the block's frame
        else:
            self.message.show_tail(tail)

    def finish(self, full_text: Optional[str] = None, footer: str = "") -> asyncio.Task:
        """End the stream; `full_text` (the engine's final text) replaces what was streamed."""
        self.finished = True
        return asyncio.create_task(self._finish(full_text, footer))

    async def _finish(self, full_text: Optional[str], footer: str) -> None:
        if self._drain is not None:
            await self._drain
        await self._mounted
        text = self.text if full_text is None else full_text
        self.message.raw_text = text
        if not self.message.is_attached:
            return  # removed meanwhile (regenerate, new chat, quit)
        with self.message.app.batch_update():  # the full Markdown replaces Markdown and tail in one frame
            await self.message.body.update(visible(display_text(text)) if text else "*(empty reply)*")
            if not self.message.is_attached or not self.message.query(".message-tail"):
                return  # taken down while the Markdown was parsed (a replay jump, quit)
            self.message.hide_tail()
            self.message.set_footer(footer)
            self.message.refresh_header()


class Note(Static):
    """A line from the app itself: an error, a notice, a hint."""

    def __init__(self, text: str, severity: str = "information", **kwargs) -> None:
        super().__init__(visible(text), markup=False, **kwargs)
        self.add_class(f"-{severity}")


class LoadingPanel(Vertical):
    """Shown while a model loads: what is happening and how far along."""

    def __init__(self, model: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.model = model

    def compose(self) -> ComposeResult:
        yield Label(visible(f"Loading {self.model}"), classes="loading-title", markup=False)
        yield Label("starting", classes="loading-stage", markup=False)
        yield ProgressBar(total=100, show_eta=False)

    def set_progress(self, stage: str, fraction: float) -> None:
        self.query_one(".loading-stage", Label).update(stage)
        self.query_one(ProgressBar).update(progress=max(0.0, min(1.0, fraction)) * 100)


class ChatView(VerticalScroll):
    """The conversation pane."""

    def on_mount(self) -> None:
        self._typed_to_prompt = False  # keys typed here went to the prompt, which has not taken the focus yet
        self.anchor()

    def allow_focus(self) -> bool:
        # with messages shown, Tab goes to them straight away (a focused message scrolls the view as well)
        return self.can_focus and not self.query(MessageBlock)

    # typing or pasting while the conversation (or a message in it) has focus goes to the prompt,
    # not nowhere; a key a focused message binds (e, c, d, ...) stays that message's
    def _prompt(self):
        prompt = getattr(self.app, "prompt", None)
        return prompt if prompt is not None and self.screen is getattr(self.app, "main_screen", None) else None

    def on_key(self, event: events.Key) -> None:
        prompt = self._prompt()
        if prompt is not None and event.key == "enter" and self._typed_to_prompt:
            # typed fast, Enter came before the focus reached the prompt: it sends what was typed
            event.stop()
            event.prevent_default()
            self._typed_to_prompt = False
            prompt.submit()
            return
        if prompt is None or not event.is_printable or not event.character:
            return
        # a bound key (e, c, d, ...) is the message's, unless typing already went to the prompt: the rest of a
        # burst typed before the focus got there is text too, never an edit or a delete
        if event.key in self.screen.active_bindings and not self._typed_to_prompt:
            return
        event.stop()
        event.prevent_default()
        self._typed_to_prompt = True
        prompt.focus()
        prompt.insert(event.character)

    def on_descendant_focus(self) -> None:
        self._typed_to_prompt = False  # focus came back here: an Enter is no longer the prompt's

    def on_paste(self, event: events.Paste) -> None:
        prompt = self._prompt()
        if prompt is None:
            return
        event.stop()
        prompt.focus()
        prompt.post_message(events.Paste(event.text))  # its own handler makes the text promptable

    def _add(self, widget):
        mounted = self.mount(widget)
        return widget, mounted

    def follow(self) -> None:
        """Back to the bottom, following the stream again (a message just sent is what the user looks at)."""
        self.anchor()
        self.call_after_refresh(self.anchor)  # once the new messages are laid out

    def add_user(self, text: str, message_id: Optional[str] = None,
                 versions: Optional[tuple[int, int]] = None) -> UserMessage:
        return self._add(UserMessage(text, message_id, versions))[0]

    def add_system(self, text: str, message_id: Optional[str] = None) -> SystemPromptMessage:
        return self._add(SystemPromptMessage(text, message_id))[0]

    def add_assistant(self, text: str, footer: str = "", message_id: Optional[str] = None,
                      versions: Optional[tuple[int, int]] = None) -> AssistantMessage:
        """A finished reply (a session opened from disk)."""
        return self._add(AssistantMessage(text, footer, message_id, versions))[0]

    def start_assistant(self, markdown_interval: Optional[float] = MARKDOWN_INTERVAL_S) -> AssistantHandle:
        message, mounted = self._add(AssistantMessage())
        return AssistantHandle(message, mounted, markdown_interval)

    def add_note(self, text: str, severity: str = "information") -> Note:
        return self._add(Note(text, severity))[0]

    def show_loading(self, model: str) -> LoadingPanel:
        self.hide_loading()
        return self._add(LoadingPanel(model))[0]

    def hide_loading(self) -> None:
        self.query(LoadingPanel).remove()

    @property
    def loading_panel(self) -> Optional[LoadingPanel]:
        panels = self.query(LoadingPanel)
        return panels.first() if panels else None

    def messages(self) -> list[MessageBlock]:
        return list(self.query(MessageBlock))

    def block_for(self, message_id: str) -> Optional[MessageBlock]:
        """The shown message with the session's id `message_id`."""
        return next((b for b in self.query(MessageBlock) if b.message_id == message_id), None)

    def last_assistant(self) -> Optional[AssistantMessage]:
        found = self.query(AssistantMessage)
        return found.last() if found else None

    async def clear(self) -> None:
        """Remove every message, once the ones still mounting are mounted (the fill before this clear
        mounts without waiting; a message taken away mid-mount loses its parts under its own on_mount)."""
        mounting = [child for child in self.children if not child.is_mounted]
        if mounting:
            await AwaitMount(self, mounting)
        await self.remove_children()
