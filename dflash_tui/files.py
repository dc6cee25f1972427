"""Reading and writing the app's own files safely.

Reads take regular files only, size-checked before a byte is read: a fifo
named `*.json` would block forever, a link to /dev/zero would never end.
Writes go to a temp file in the same folder and replace the old one whole;
temp files a killed process left behind are swept later. A file written to a
path the user gave never replaces one there and never creates a folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
import time
from pathlib import Path

TEMP_SUFFIX = ".tmp"
STALE_TEMP_S = 60.0  # a save writes its temp file in well under this; an older one is a killed save's


class NotRegularFile(OSError):
    """Not a regular file (a fifo, a device, a folder): never opened for reading."""


class TooBig(OSError):
    """Bigger than the caller's limit."""


class Refused(OSError):
    """A write refused before a byte was written (a missing folder, a name taken); the message says why."""


def read_regular_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes`; raises OSError (NotRegularFile, TooBig) otherwise."""
    st = os.stat(path)  # follows a link: what is read is what it points at
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(f"not a regular file ({_kind(st.st_mode)})")
    if st.st_size > max_bytes:
        raise TooBig(f"too big ({st.st_size} bytes)")
    # O_NONBLOCK: if it was swapped for a fifo since the stat, opening does not wait for a writer
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile("not a regular file")
        data = fh.read(max_bytes + 1)  # it may have grown since the stat
    if len(data) > max_bytes:
        raise TooBig(f"too big (over {max_bytes} bytes)")
    return data


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a fifo"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
                       (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def atomic_write(path: Path, payload: bytes) -> None:
    """Temp file in the same directory + os.replace: a crash never leaves half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def check_writable(folder: Path) -> None:
    """Make and remove a file in `folder`: OSError where none can be written there (read-only, no
    permission, a full disk), told before a long run rather than after it."""
    fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-check-", suffix=TEMP_SUFFIX)
    os.close(fd)
    os.unlink(probe)


def _umask() -> int:
    mask = os.umask(0o022)  # reading it sets it: put it back at once (done once, at import)
    os.umask(mask)
    return mask


_NEW_FILE_MODE = 0o666 & ~_umask()


def write_new_file(path: Path, payload: bytes) -> None:
    """Write a file that does not exist yet into a folder that does; Refused otherwise. Never creates a
    folder, never replaces a file, never leaves half a file."""
    folder = path.parent
    if not folder.is_dir():
        raise Refused(f"{'not a folder' if folder.exists() else 'no such folder'}: {folder}")
    if os.path.lexists(path):
        raise Refused(f"already exists: {path}")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.stem}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fd, _NEW_FILE_MODE)  # a file asked for, made as the shell's `>` makes one (mkstemp's is 0600)
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        _link_new(tmp, path, payload)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _link_new(tmp: str, path: Path, payload: bytes) -> None:
    """Give the written temp file its name; a link, unlike a rename, fails where the name was taken meanwhile."""
    try:
        os.link(tmp, path)
        return
    except FileExistsError:
        raise Refused(f"already exists: {path}") from None
    except OSError:
        pass  # no hard links on this file system: create the name exclusively and write it there
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), _NEW_FILE_MODE)
    except FileExistsError:
        raise Refused(f"already exists: {path}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


# what atomic_write names its temp files: "." + stem + "." + mkstemp's random part + ".tmp"
_TEMP_NAME = re.compile(r"^\.[A-Za-z0-9][A-Za-z0-9_-]{0,79}\.[A-Za-z0-9_]{6,12}\.tmp$")


def sweep_stale_temps(folder: Path, older_than_s: float = STALE_TEMP_S) -> list[str]:
    """Remove the temp files of saves that were killed (only our own names, only regular files)."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    cutoff = time.time() - older_than_s
    for entry in entries:
        if not _TEMP_NAME.match(entry.name):
            continue
        with contextlib.suppress(OSError):  # a read-only folder, or another process got there first
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff:
                os.unlink(entry.path)
                removed.append(entry.name)
    return removed
