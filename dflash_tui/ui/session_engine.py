"""A saved session from another engine (a server while this app runs here, here while it runs on a
server, another server): it opens for reading, and continues on the engine in use, never by loading
the other engine's model name here.

The continuation is a new session seeded with the conversation's text: the saved one keeps its
traces and the engine that made them, and new turns are recorded with the engine that makes them.
"""

from __future__ import annotations

from typing import Any, Optional

from dflash_tui.model_names import model_label


def engine_name(server: Optional[str]) -> str:
    return server if server else "this machine"


def ran_elsewhere(session: Any, server: Optional[str]) -> bool:
    """Whether `session` was made on another engine than the one at `server` (None: this machine)."""
    return (session.server or None) != (server or None)


def continued_here(store: Any, session: Any, target: str, draft: Optional[str], settings: dict[str, Any],
                   device: Optional[str], server: Optional[str]) -> Any:
    """A new session on this engine with `session`'s conversation in view, as text."""
    copy = store.new(target, draft, settings, device=device, server=server)
    for message in session.messages:
        copy.add_message(message.role, message.content, None)
    copy.title = session.title
    return copy


def elsewhere_note(session: Any, target: Optional[str], server: Optional[str]) -> str:
    """The one line that says where the session ran and where it goes on."""
    here = f"{model_label(target)} on {engine_name(server)}" if target else engine_name(server)
    return (f"This session ran {model_label(session.target)} on {engine_name(session.server)}; it is open for "
            f"reading and replay (sessions list), and goes on with {here} as a new session (the saved one stays as it was).")
