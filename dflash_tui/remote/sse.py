"""Server-sent events off a byte stream: `data:` payloads, with a cap on any one line."""

from __future__ import annotations

from typing import Iterable, Iterator

MAX_LINE_BYTES = 4 << 20  # no chunk of a chat stream comes near this; a server that sends more is broken


class StreamGarbage(ValueError):
    """The stream is not server-sent events a client can read; the message says how."""


def data_lines(chunks: Iterable[bytes], max_line: int = MAX_LINE_BYTES) -> Iterator[str]:
    """Each event's data (multi-line data joined with newlines), as text; comments and other fields skipped."""
    buffer = b""
    data: list[str] = []
    for chunk in chunks:
        buffer += chunk
        while True:
            cut = buffer.find(b"\n")
            if cut < 0:
                if len(buffer) > max_line:
                    raise StreamGarbage(f"a line of more than {max_line} bytes")
                break
            raw, buffer = buffer[:cut].rstrip(b"\r"), buffer[cut + 1:]
            line = raw.decode("utf-8", "replace")
            if not line:  # an empty line ends the event
                if data:
                    yield "\n".join(data)
                    data = []
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            if field == "data":
                data.append(value[1:] if value.startswith(" ") else value)
    tail = buffer.rstrip(b"\r").decode("utf-8", "replace")
    if tail.startswith("data:"):
        data.append(tail[5:].lstrip(" "))
    if data:
        yield "\n".join(data)
