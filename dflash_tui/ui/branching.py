"""Editing and branching the conversation: edit a message you wrote (a fork; the old branch is
kept), show another version of a message (`[` / `]`, `‹ 2/3 ›` in its header), delete a message
and its reply. The session's tree does the work (session_record.Session); this part shows it.

After each change the session is saved, the chat shows the branch in view again, the acceptance
pane shows the trace of the reply in view, and the engine gets the branch (`Restore`; its cache
reuses the prefix the branches have in common).

Mixed into the app (ui/app.py), whose chat, panes, prompt, engine and session it uses.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from dflash_tui.engine.events import Block
from dflash_tui.figure_rules import reply_summary
from dflash_tui.session_tree import Message, engine_view, system_of
from dflash_tui.ui.chat_view import MessageBlock, UserMessage
from dflash_tui.ui.prompt import PromptBox, message_text, prompt_text
from dflash_tui.ui.worker import Restore

# the pair goes together, whichever of the two is focused
DELETE_QUESTION = {"user": "Delete this message and its reply?", "assistant": "Delete this reply and the message it answers?"}
DELETE_AFTER = "\n\nThe turns after them move up into their place; other branches stay as they are."


def reply_for(messages: Sequence[Message], message_id: Optional[str]) -> Optional[Message]:
    """The reply whose trace to show: the first at or below `message_id` in the branch, else the last one."""
    replies = [m for m in messages if m.role == "assistant"]
    ids = [m.id for m in messages]
    if message_id in ids:
        below = [m for m in messages[ids.index(message_id):] if m.role == "assistant"]
        if below:
            return below[0]
    return replies[-1] if replies else None


class Branching:
    """The branch part of the app: edit, versions, delete a pair, and showing the branch in view."""

    session: Any
    system_prompt: str
    generating: bool

    # -- showing the branch in view ---------------------------------------------------------
    def render_messages(self, session: Any, messages: Sequence[Message]) -> None:
        """Add `messages` to the (cleared) chat, each with its id and its place among its versions."""
        for m in messages:
            siblings = session.siblings(m.id) if m.id else None
            if m.role == "user":
                self.chat.add_user(m.content, m.id or None, siblings)
            elif m.role == "assistant":
                self.chat.add_assistant(m.content, reply_summary(m.done()), m.id or None, siblings)
            elif m.role == "system":
                self.chat.add_system(m.content, m.id or None)

    def show_trace(self, reply: Optional[Message]) -> None:
        """The acceptance pane shows `reply`'s recorded cycles (empty for none)."""
        done = reply.done() if reply is not None else None
        mode = self.acceptance_mode() if done is None else (
            "dflash" if done.stats.get("mode", "dflash") == "dflash" else "baseline")
        self.acceptance.reset(mode)
        if reply is not None:
            self.acceptance.add_blocks([e for e in reply.events() if isinstance(e, Block)])
            self.acceptance.show_figures()

    async def show_branch(self, focus: Optional[str] = None) -> None:
        """The chat, the acceptance pane and the engine follow the session's branch in view."""
        session = self.session
        await self.chat.clear()
        self.render_messages(session, session.messages)
        self.show_trace(reply_for(session.messages, focus))
        self.system_prompt = session.system_prompt()
        self.engine.submit(Restore(session.conversation()))
        if focus is not None:
            self.call_after_refresh(self._focus_message, focus)

    def _focus_message(self, message_id: str) -> None:
        block = self.chat.block_for(message_id)
        if block is not None:
            block.focus()

    def label_turn(self) -> None:
        """The turn just recorded: its messages on screen get their ids and versions (`‹ 2/2 ›`)."""
        user_block, reply_block = self._turn_blocks
        self._turn_blocks = (None, None)
        messages = self.session.messages if self.session is not None else []
        # the reply is the last one in view (system prompts set after it may follow), its user message before it
        at = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=len(messages) - 1)
        pairs = [(reply_block, messages[at : at + 1]), (user_block, messages[at - 1 : at] if at > 0 else [])]
        for block, found in pairs:
            if block is not None and found:
                block.set_branch(found[0].id, self.session.siblings(found[0].id))

    # -- requests from the messages and the palette -------------------------------------------
    async def on_message_block_branch_request(self, event: MessageBlock.BranchRequest) -> None:
        event.stop()
        await self.branch_action(event.message_id, event.what, event.step)

    async def branch_action(self, message_id: str, what: str, step: int = 0) -> None:
        if what == "edit":
            self.begin_edit(message_id)
        elif what == "sibling":
            await self.switch_sibling(message_id, step)
        elif what == "delete_pair":
            self.ask_delete_pair(message_id)

    async def branch_from_palette(self, what: str, step: int = 0) -> None:
        """The palette's entries: on the focused message, else the last one it makes sense for."""
        focused = self.focused
        if isinstance(focused, MessageBlock) and focused.check_action(what, ()):
            await self.branch_action(focused.message_id, what, step)
            return
        blocks = [b for b in self.chat.messages() if b.message_id]
        if what == "sibling":
            blocks = [b for b in blocks if b.versions and b.versions[1] > 1]
        elif what in ("edit", "delete_pair"):
            blocks = [b for b in blocks if isinstance(b, UserMessage)]
        if not blocks:
            nothing = {"sibling": "No message in view has other versions",
                       "edit": "There is no saved message of yours to edit",
                       "delete_pair": "There is no saved message to delete"}[what]
            self.notify(nothing, severity="warning", timeout=3)
            return
        await self.branch_action(blocks[-1].message_id, what, step)

    def _branch_message(self, message_id: str) -> Optional[Message]:
        """The session's message, or None (said why) while a reply streams or when it is gone."""
        if self.generating:
            self.notify("A reply is streaming; press Esc to stop it first", severity="warning")
            return None
        if self.session is None:
            self.notify("This conversation has no saved messages yet", severity="warning")
            return None
        try:
            return self.session.tree.get(message_id)
        except KeyError:
            self.notify("That message is no longer in this session", severity="warning")
            return None

    # -- edit: a fork ------------------------------------------------------------------------------
    def begin_edit(self, message_id: str) -> None:
        message = self._branch_message(message_id)
        if message is None:
            return
        if message.role != "user":
            self.notify("Only a message you wrote can be edited; regenerate a reply (ctrl+r)", severity="warning")
            return
        shown = [m.id for m in self.session.messages if m.role != "system"]
        number = shown.index(message_id) + 1 if message_id in shown else 0
        self.prompt.begin_edit(message_id, number, message.content)
        self.prompt.focus()

    async def on_prompt_box_edit_sent(self, event: PromptBox.EditSent) -> None:
        """Enter on an edited message: the chat shows the branch up to it, then the new message and its reply."""
        event.stop()
        message = self._branch_message(event.message_id)
        if message is None:
            if not self.generating:
                self.prompt.end_edit(restore=True)
            return
        if not self._can_start():
            return  # the edit stays in the prompt
        if event.text in (message.content, message_text(prompt_text(message.content))):
            self.notify("The text is unchanged: change it and press Enter, or Esc to cancel", severity="warning")
            return
        tree = self.session.tree
        before = [tree.get(i) for i in tree.path_to(message.parent)] if message.parent is not None else []
        self.prompt.end_edit()
        self.prompt.remember(event.text)
        await self.chat.clear()
        self.render_messages(self.session, before)
        restored = engine_view(before)
        self.system_prompt = system_of(restored)
        self.engine.submit(Restore(restored))
        text = event.text[1:] if event.text.startswith("//") else event.text  # '//' is a literal '/', as in a send
        self.start_turn(text, edit_of=message.id)  # recorded once the reply is done (app._record_turn)

    def end_edit_if_gone(self) -> None:
        """After a slash command: an edit whose message is no longer in view (/new, another session) ends."""
        editing = self.prompt.editing
        if editing is None:
            return
        if self.session is None or editing not in {m.id for m in self.session.messages}:
            self.prompt.end_edit(restore=True)
            self.notify("The message being edited is no longer in view: the edit is cancelled", timeout=3)

    def after_failed_turn(self, reason: str) -> None:
        """A failed edit or regenerate is not kept: the chat and the engine go back to the session's branch
        (the engine had let go of the reply it was replacing)."""
        if self.session is None or (self._turn_edit is None and self._turn_user_text is not None):
            return
        what = "edit" if self._turn_edit is not None else "new reply"
        self._turn_edit = None

        async def back() -> None:
            await self.show_branch()
            self.chat.add_note(f"The {what} was not kept ({reason}); this is the branch as it was.", "error")

        self.call_later(back)

    # -- versions: [ and ] ------------------------------------------------------------------------
    async def switch_sibling(self, message_id: str, step: int) -> None:
        if self._branch_message(message_id) is None:
            return
        shown = self.session.switch(message_id, step)
        if shown is None:
            self.notify(f"This is the {'first' if step < 0 else 'last'} version", timeout=2)
            return
        self.save_session(announce=False)
        await self.show_branch(focus=shown.id)

    # -- delete a pair -----------------------------------------------------------------------------
    def ask_delete_pair(self, message_id: str) -> None:
        message = self._branch_message(message_id)
        if message is None:
            return
        if message.role not in ("user", "assistant"):
            self.notify("Only a message and its reply can be deleted", severity="warning")
            return
        from dflash_tui.ui.sessions_screen import ConfirmScreen

        def answered(yes: Optional[bool]) -> None:
            if yes:
                self.call_later(self.delete_pair, message_id)

        self.push_screen(ConfirmScreen(DELETE_QUESTION[message.role] + DELETE_AFTER), answered)

    async def delete_pair(self, message_id: str) -> None:
        if self._branch_message(message_id) is None:
            return
        try:
            removed = self.session.delete_pair(message_id)
        except (KeyError, ValueError) as exc:
            self.notify(f"could not delete: {exc}", severity="error")
            return
        self.save_session(announce=False)
        await self.show_branch()
        self.notify(f"Deleted {len(removed)} message{'s' if len(removed) != 1 else ''}", timeout=3)
