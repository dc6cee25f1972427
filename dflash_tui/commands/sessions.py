"""`dflash-tui sessions list|show|export|delete`: saved sessions from the shell."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dflash_tui.errors import UserError
from dflash_tui.printable import one_line, printable, terminal_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("list", help="saved sessions, newest first")
    p.add_argument("--json", action="store_true", help="one JSON object: sessions and unreadable files")
    p = sub.add_parser("show", help="one session's messages and figures")
    p.add_argument("session", metavar="SESSION", help="an id or a path to a session file")
    p.add_argument("--json", action="store_true", help="the session file's JSON")
    p = sub.add_parser("export", help="write a session as Markdown or JSON")
    p.add_argument("session", metavar="SESSION", help="an id or a path to a session file")
    p.add_argument("--format", "-f", choices=("markdown", "md", "json"), default="markdown")
    p.add_argument("--output", "-o", metavar="PATH", help="write here (default: standard output)")
    p = sub.add_parser("delete", help="delete a saved session")
    p.add_argument("session", metavar="ID", help="a session id")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")


def run(args: argparse.Namespace) -> int:
    from dflash_tui.sessions import SessionStore

    store = SessionStore()
    return {"list": _list, "show": _show, "export": _export, "delete": _delete}[args.action](store, args)


def _list(store, args) -> int:
    summaries, problems = store.list()
    if args.json:
        print(terminal_json(json.dumps({"sessions": [s.to_dict() for s in summaries], "problems": problems},
                                       ensure_ascii=False, indent=1)))
        return 0
    if not summaries:
        print(f"no saved sessions in {one_line(store.root)}")
    for s in summaries:
        tpc = f"{s.tokens_per_cycle:.2f} tok/cycle" if s.tokens_per_cycle is not None else "target only"
        updated = one_line(s.updated[:16].replace("T", " "))
        print(f"{s.id}  {updated}  {s.messages:>3} msgs  {tpc:>15}  {one_line(s.title)}")
    for p in problems:
        print(f"skipped {one_line(p)}", file=sys.stderr)
    return 0


def _show(store, args) -> int:
    from dflash_tui.sessions import reply_summary, to_json

    session = store.load(args.session)
    if args.json:
        sys.stdout.write(to_json(session))
        return 0
    print(f"{one_line(session.title)}  ({session.id})")
    print(one_line(f"target {session.target}  draft {session.draft or 'none'}  updated {session.updated}"))
    tpc = session.tokens_per_cycle()
    if tpc is not None:
        print(f"{session.generated_tokens()} tokens generated, {tpc:.2f} tokens per cycle")
    for m in session.messages:
        print(f"\n[{m.role}]")
        print(printable(m.content))
        figures = reply_summary(m.done()) if m.role == "assistant" else ""
        if figures:
            print(f"  ({figures})")
    return 0


def _export(store, args) -> int:
    from dflash_tui.sessions import export_text

    session = store.load(args.session)
    if args.output:
        try:
            path = store.export(session, args.format, Path(args.output))
        except OSError as exc:
            raise UserError(f"could not write {args.output}: {exc.strerror or exc}") from None
        print(f"wrote {one_line(path)}", file=sys.stderr)
    else:
        sys.stdout.write(export_text(session, args.format))  # both formats are safe on a terminal
    return 0


def _delete(store, args) -> int:
    session = store.load(store.path_for(args.session))
    if not args.yes:
        if not sys.stdin.isatty():
            raise UserError("not deleting without confirmation; pass --yes")
        answer = input(f"Delete “{one_line(session.title)}” ({len(session.messages)} messages)? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("kept", file=sys.stderr)
            return 1
    try:
        path = store.delete(session.id)
    except OSError as exc:
        raise UserError(f"could not delete {session.id}: {exc.strerror or exc}") from None
    print(f"deleted {one_line(path)}", file=sys.stderr)
    return 0
