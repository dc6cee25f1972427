"""Compose a long prompt in the user's own editor ($VISUAL, else $EDITOR, else vi)."""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass
class Edited:
    text: Optional[str]  # None: keep the prompt as it was
    problem: Optional[str] = None  # why, in one line, when the editor did not give text back


def editor_command() -> list[str]:
    """The editor to run, split as a shell would (`code --wait` is two words)."""
    for name in ("VISUAL", "EDITOR"):
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return shlex.split(value)
            except ValueError:  # unbalanced quotes: take it whole
                return [value]
    return ["vi"]


def edit_text(text: str, command: Optional[list[str]] = None) -> Edited:
    """Hand `text` to the editor in a temporary file and read back what it holds once the editor exits.

    The terminal must be the editor's while it runs (the app suspends itself around this call).
    """
    command = command or editor_command()
    fd, name = tempfile.mkstemp(prefix="dflash-prompt-", suffix=".md")
    path = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        try:
            result = subprocess.run([*command, str(path)], check=False)
        except OSError as exc:  # not found, not executable
            return Edited(None, f"could not run the editor {command[0]!r}: {exc.strerror or exc}")
        if result.returncode != 0:
            return Edited(None, f"the editor {command[0]!r} exited with status {result.returncode}; the prompt is unchanged")
        try:
            edited = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return Edited(None, f"could not read the edited text back: {exc}")
    finally:
        path.unlink(missing_ok=True)
    # editors end the file with a newline the user did not type
    return Edited(edited[:-1] if edited.endswith("\n") else edited)
