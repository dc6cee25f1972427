"""`dflash-tui sessions list|search|show|export|delete`: saved sessions from the shell.

A session is named by its id, any unique prefix of it, or a path to a session file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dflash_tui.errors import UserError
from dflash_tui.files import Refused
from dflash_tui.printable import one_line, printable, terminal_json

SESSION_HELP = "an id, a unique prefix of one, or a path to a session file"
SNIPPETS = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("list", help="saved sessions, newest first (and where they are)")
    p.add_argument("--json", action="store_true", help="one JSON object: folder, sessions and unreadable files")
    p = sub.add_parser("search", help="sessions whose title or messages hold every word of TEXT")
    p.add_argument("text", metavar="TEXT", help="words (each matches as a word prefix; case and accents ignored; "
                                                "text that starts with - after --)")
    p.add_argument("--json", action="store_true", help="one JSON object: the sessions found")
    p.add_argument("--snippets", type=int, default=SNIPPETS, metavar="N",
                   help=f"show the words in context for the newest N found (default {SNIPPETS})")
    p = sub.add_parser("show", help="one session's messages (the branch in view) and figures")
    p.add_argument("session", metavar="SESSION", help=SESSION_HELP)
    p.add_argument("--json", action="store_true", help="the session file's JSON")
    p = sub.add_parser("export", help="write a session, a branch or one message as Markdown or JSON")
    p.add_argument("session", metavar="SESSION", help=SESSION_HELP)
    p.add_argument("--format", "-f", choices=("markdown", "md", "json"), default="markdown")
    p.add_argument("--output", "-o", metavar="PATH",
                   help="write a new file here, in a folder that exists, or into a folder (default: standard output)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--message", metavar="N|ID", help="only this message (its number in `show`, or its id)")
    which.add_argument("--branch", metavar="ID", help="the branch through this message id (default: the one in view)")
    p = sub.add_parser("delete", help="delete a saved session")
    p.add_argument("session", metavar="ID", help="a session id or a unique prefix of one")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")


def run(args: argparse.Namespace) -> int:
    from dflash_tui.sessions import SessionStore

    store = SessionStore()
    actions = {"list": _list, "search": _search, "show": _show, "export": _export, "delete": _delete}
    return actions[args.action](store, args)


def _line(s) -> str:
    from dflash_tui.session_record import cut_title  # here: building the parser loads no session code

    tpc = f"{s.tokens_per_cycle:.2f} tok/cycle" if s.tokens_per_cycle is not None else "target only"
    updated = one_line(s.updated[:16].replace("T", " "))
    title = one_line(cut_title(s.title))  # as the app cuts its titles: a file edited by hand may hold any length
    return f"{s.id}  {updated}  {s.messages:>3} msgs  {tpc:>15}  {one_line(s.model):<18}  {title}"


def _list(store, args) -> int:
    store.check()  # a file where the folder should be: say so, never "0 session(s)"
    summaries, problems = store.list()
    if args.json:
        print(terminal_json(json.dumps({"folder": str(store.root), "sessions": [s.to_dict() for s in summaries],
                                        "problems": problems}, ensure_ascii=False, indent=1)))
        return 0
    # where the files are goes to stderr: standard output stays one session a line
    print(f"{len(summaries)} session(s) in {one_line(store.root)}", file=sys.stderr)
    if summaries:
        sys.stdout.write("\n".join(_line(s) for s in summaries) + "\n")
    for p in problems:
        print(f"skipped {one_line(p)}", file=sys.stderr)
    return 0


def _search(store, args) -> int:
    if not args.text.strip():  # every session "holds" nothing: a usage error, as argparse's are (exit 2)
        raise UserError("sessions search: give a word to look for (`sessions list` lists every session)",
                        exit_code=2)
    if args.snippets < 0:
        raise UserError(f"--snippets: 0 or more, got {args.snippets}", exit_code=2)
    store.check()
    hits, problems = store.search(args.text, snippets=args.snippets)
    if args.json:
        found = [dict(h.summary.to_dict(), snippet=h.snippet) for h in hits]
        print(terminal_json(json.dumps({"folder": str(store.root), "query": args.text, "sessions": found,
                                        "problems": problems}, ensure_ascii=False, indent=1)))
        return 0
    print(f"{len(hits)} session(s) in {one_line(store.root)} hold {one_line(args.text)!r}", file=sys.stderr)
    for h in hits:
        print(_line(h.summary))
        if h.snippet:
            print(f"    {one_line(h.snippet)}")
    for p in problems:
        print(f"skipped {one_line(p)}", file=sys.stderr)
    return 0 if hits else 1


def _show(store, args) -> int:
    from dflash_tui.model_names import model_label
    from dflash_tui.sessions import reply_summary, to_json

    session = store.load(args.session)
    if args.json:
        sys.stdout.write(to_json(session))
        return 0
    print(f"{one_line(session.title)}  ({session.id})")
    draft = model_label(session.draft) if session.draft else "none"
    print(one_line(f"model {model_label(session.target)}  draft {draft}  updated {session.updated}"))
    tpc = session.tokens_per_cycle()
    if tpc is not None:
        print(f"{session.generated_tokens()} tokens generated, {tpc:.2f} tokens per cycle")
    branches = session.tree.leaves()
    if branches > 1:
        print(f"{branches} branches; the one in view:")
    for n, m in enumerate(session.messages, 1):
        at, count = session.siblings(m.id)
        siblings = f"  ‹ {at}/{count} ›" if count > 1 else ""
        print(f"\n[{n}] {m.role} · {m.id}{siblings}")
        print(printable(m.content))
        figures = reply_summary(m.done()) if m.role == "assistant" else ""
        if figures:
            print(f"  ({figures})")
    return 0


def _export(store, args) -> int:
    from dflash_tui.sessions import export_text

    session = store.load(args.session)
    try:
        if args.output:
            try:
                path = store.export(session, args.format, Path(args.output), message=args.message, branch=args.branch)
            except Refused as exc:  # a missing folder or a file already there: the message says which
                raise UserError(str(exc)) from None
            except OSError as exc:
                raise UserError(f"could not write {args.output}: {exc.strerror or exc}") from None
            print(f"wrote {one_line(path)}", file=sys.stderr)
        else:
            text = export_text(session, args.format, message=args.message, branch=args.branch)
            sys.stdout.write(text)  # both formats are safe on a terminal
    except KeyError as exc:
        raise UserError(f"{session.id}: {exc.args[0] if exc.args else exc}") from None
    return 0


def _delete(store, args) -> int:
    session = store.load(store.path_for(store.resolve_id(args.session)))
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
