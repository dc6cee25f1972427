"""Every key the chat answers to: the app's bindings and the rows of the F1 help, from one table.

ctrl+l (clear the screen in a shell), ctrl+m, ctrl+i, ctrl+j and ctrl+h (Enter,
Tab, line feed and Backspace in most terminals) are never bound to an action.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding

# keys a terminal may send for something else, or that mean "clear" to most users
RESERVED = frozenset({"ctrl+l", "ctrl+m", "ctrl+i", "ctrl+j", "ctrl+h"})
SWITCH_PANE_KEY = "f4"  # ui/pane_switch.py: the pane's and the meter's border titles name it


@dataclass(frozen=True)
class AppKey:
    key: str  # Textual's name
    action: str
    label: str  # the footer's word
    help: str  # the F1 help's line
    footer: bool = True


# F1 first: the footer lists a focused message's keys before these, and cuts what does not fit
APP_KEYS: tuple[AppKey, ...] = (
    AppKey("f1", "help", "Help", "this help"),
    AppKey("escape", "stop", "Stop", "stop the reply (what was produced is kept)"),
    AppKey("ctrl+r", "regenerate", "Regenerate",
           "regenerate the last reply (after a failed one: send its message again)"),
    AppKey("ctrl+n", "new_chat", "New", "new conversation"),
    AppKey("f3", "pick_model", "Model", "pick another model pair (also /model and the palette)"),
    AppKey("ctrl+o", "sessions", "Sessions", "saved sessions: open, replay, rename, delete, export"),
    AppKey("ctrl+y", "copy_reply", "Copy reply", "copy the last (or the focused) message", footer=False),
    AppKey("f2", "toggle_panes", "Panes", "hide or show the acceptance and system panes", footer=False),
    # not in the footer: the pane's border title says it, where it applies (under 64 columns)
    AppKey(SWITCH_PANE_KEY, "switch_pane", "Meter/pane",
           "under 64 columns, where the side row has room for one pane: switch it between the acceptance pane and "
           "the system meter (in a replay too)", footer=False),
)

# how a message gets the focus, for the keys below
FOCUS_KEYS: tuple[tuple[str, str], ...] = (
    ("tab · shift+tab · a click", "focus a message, for the keys below: tab from the prompt goes to the latest "
                                  "message, then to older ones; shift+tab to newer ones and back to the prompt"),
)

# keys a focused message answers to (click it or Tab to it); the branch keys act on a saved message
MESSAGE_KEYS: tuple[AppKey, ...] = (
    AppKey("c", "copy_message", "Copy", "on a focused message: copy it"),
    # not in the footer: with a message focused, the footer had no room left for F1 (which lists it)
    AppKey("y", "copy_code", "Copy code", "on a focused message: copy its code blocks", footer=False),
    AppKey("e", "edit", "Edit", "on a message you wrote: edit it in the prompt; Enter forks the conversation "
                                "there (the old branch is kept), Esc cancels"),
    AppKey("left_square_bracket", "previous_version", "‹ Prev", "on a message marked ‹ 2/3 ›: the previous version "
                                                           "(an earlier edit or reply) and its branch"),
    AppKey("right_square_bracket", "next_version", "Next ›", "on a message marked ‹ 2/3 ›: the next version"),
    AppKey("d,delete", "delete_pair", "Delete pair", "on a message: delete it and its reply (asks first); "
                                                     "the turns after them move up"),
)
_HELP_KEY_NAMES = {"left_square_bracket": "[", "right_square_bracket": "]", "d,delete": "d / delete"}

# keys the prompt handles itself
PROMPT_KEYS: tuple[tuple[str, str], ...] = (
    ("enter", "send the message"),
    ("shift+enter · alt+enter · ctrl+j", "a new line in the prompt: terminals differ in which of these "
                                         "they pass on, so all three work (ctrl+j nearly everywhere)"),
    ("↑ / ↓", "on the prompt's first / last line: the previous / next message sent; elsewhere they move the cursor"),
    ("→", "complete the slash command being typed"),
    ("ctrl+e", "write the prompt in $VISUAL or $EDITOR (vi if neither is set); Enter sends it after"),
    ("ctrl+a · end", "start / end of the line (ctrl+e is the editor)"),
    ("ctrl+w · ctrl+u · ctrl+k", "delete the word before / to the line's start / to its end"),
    ("ctrl+z", "undo in the prompt"),
    ("ctrl+c", "copy the text selected in the prompt (ctrl+q quits)"),
    ("ctrl+p", "command palette"),
    ("ctrl+q", "quit"),
)


def read_alt_enter_as_new_line() -> None:
    """Most terminals send alt+enter as ESC CR, which Textual reads as a plain Enter (only terminals with
    the kitty keyboard protocol send a real alt+enter): read it as ctrl+j, the new-line key, so alt+enter
    never sends a half-written message."""
    try:
        from textual._ansi_sequences import ANSI_SEQUENCES_KEYS
        from textual.keys import Keys
    except ImportError:  # a Textual that moved its table: alt+enter is then whatever Textual makes of it
        return
    ANSI_SEQUENCES_KEYS.setdefault("\x1b\r", (Keys.ControlJ,))


def app_bindings() -> list[Binding]:
    return [Binding(k.key, k.action, k.label, show=k.footer) for k in APP_KEYS]


def message_bindings() -> list[Binding]:
    return [Binding(k.key, k.action, k.label, show=k.footer) for k in MESSAGE_KEYS]


def help_rows() -> list[tuple[str, str]]:
    """(key, what it does) for the F1 help: the app's keys, the prompt's, how to focus a message, its keys."""
    return ([(k.key, k.help) for k in APP_KEYS] + list(PROMPT_KEYS) + list(FOCUS_KEYS)
            + [(_HELP_KEY_NAMES.get(k.key, k.key), k.help) for k in MESSAGE_KEYS])
