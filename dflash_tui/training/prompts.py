"""Training prompts: a JSONL file read into conversations, and a conversation's prompt ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dflash_tui.errors import UserError
from dflash_tui.files import read_regular_file

# a regular file of at most this many bytes: a fifo or a device (/dev/zero) is refused in one line, not
# read until memory runs out; a million prompts of a kilobyte each still fit
MAX_PROMPTS_BYTES = 1 << 30


def read_prompts(path: Path) -> list[list[dict[str, str]]]:
    """JSONL of {"prompt": text} or {"messages": [...]}: the conversations to answer (a trailing reply is dropped)."""
    convs = []
    try:
        lines = read_regular_file(Path(path), MAX_PROMPTS_BYTES).decode("utf-8").splitlines()
    except OSError as exc:
        raise UserError(f"cannot read prompts file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"prompts file {path} is not UTF-8 text (byte {exc.start})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            msgs = _prompt_row(json.loads(line))
        except (ValueError, KeyError, TypeError, RecursionError):  # bad JSON, 5000-digit numbers, deep nesting
            raise UserError(f"{path}:{n}: expected a JSON object with \"prompt\" or \"messages\" (text)") from None
        while msgs and msgs[-1]["role"] == "assistant":
            msgs.pop()
        if msgs:
            convs.append(msgs)
    if not convs:
        raise UserError(f"no prompts in {path}")
    return convs


def _prompt_row(row: Any) -> list[dict[str, str]]:
    """One JSONL row as messages; raises ValueError unless every role and text is a string."""
    if not isinstance(row, dict):
        raise ValueError("not an object")
    if "messages" in row:
        if not isinstance(row["messages"], list):
            raise ValueError("messages is not a list")
        msgs = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
    else:
        msgs = [{"role": "user", "content": row["prompt"]}]
    if not all(isinstance(m["role"], str) and isinstance(m["content"], str) for m in msgs):
        raise ValueError("roles and contents must be text")
    return msgs


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The deployment prompt: the chat template with thinking off, as the engine renders it."""
    if getattr(tokenizer, "chat_template", None) is None:
        return list(tokenizer.encode("\n".join(m["content"] for m in messages)))
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, enable_thinking=False))
