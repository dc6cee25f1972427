"""`dflash-tui replay SESSION [--speed X]`: play a saved session back, no model loaded."""

from __future__ import annotations

import argparse
import math

from dflash_tui.errors import UserError

SPEED_RANGE = "0.25 to 16, or 'instant'"


def _speed(text: str) -> float:
    if text.strip().lower() in ("instant", "inf"):
        return math.inf
    try:
        value = float(text.rstrip("x×"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"speed must be {SPEED_RANGE}, not {text!r}") from None
    if not 0.25 <= value <= 16:
        raise argparse.ArgumentTypeError(f"speed must be {SPEED_RANGE}, not {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", metavar="SESSION", help="a session id (see `dflash-tui sessions list`) or a path to a session file")
    parser.add_argument("--speed", type=_speed, default=1.0, metavar="X", help=f"playback speed, {SPEED_RANGE} (default 1)")
    parser.add_argument("--paused", action="store_true", help="start paused (space plays, → steps one cycle)")


def run(args: argparse.Namespace) -> int:
    from dflash_tui.sessions import SessionStore

    session = SessionStore().load(args.session)  # SessionError is a UserError: one line, exit 1
    if not any(m.trace for m in session.messages):
        raise UserError(f"session {session.id} has no recorded replies to replay")
    from dflash_tui.ui.replay_screen import ReplayApp

    app = ReplayApp(session, speed=args.speed, paused=args.paused)
    app.run()
    return app.return_code or 0  # Textual reports a crash itself; the exit status must say so too
