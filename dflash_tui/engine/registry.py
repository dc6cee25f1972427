"""Known target → DFlash draft pairs, matched on the model name.

`mlx-community/Qwen3-8B-4bit` and `Qwen/Qwen3-8B` both name the Qwen3-8B
target: the owner and quantisation/format suffixes are ignored, and a few
spellings of one model (`Meta-Llama-3.1-8B-Instruct`) are aliases.

The pairs are z-lab's published drafts, as listed in the "Supported Models"
table of github.com/z-lab/dflash (README, 2026) and the drafts' Hugging Face
pages. The table is tested name by name in tests/test_registry.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class KnownPair:
    key: str  # canonical target name (see canonical_name)
    draft: str  # the draft's hub repo
    suggested: str  # a hub repo id that runs the pair as published (for the model picker)
    aliases: tuple[str, ...] = ()  # other canonical spellings of the same model


PAIRS: tuple[KnownPair, ...] = (
    KnownPair("qwen3-4b", "z-lab/Qwen3-4B-DFlash-b16", "Qwen/Qwen3-4B"),
    KnownPair("qwen3-8b", "z-lab/Qwen3-8B-DFlash-b16", "Qwen/Qwen3-8B"),
    KnownPair("qwen3-coder-30b-a3b-instruct", "z-lab/Qwen3-Coder-30B-A3B-DFlash", "Qwen/Qwen3-Coder-30B-A3B-Instruct"),
    KnownPair("qwen3-coder-next", "z-lab/Qwen3-Coder-Next-DFlash", "Qwen/Qwen3-Coder-Next"),
    KnownPair("qwen3.5-4b", "z-lab/Qwen3.5-4B-DFlash", "Qwen/Qwen3.5-4B"),
    KnownPair("qwen3.5-9b", "z-lab/Qwen3.5-9B-DFlash", "Qwen/Qwen3.5-9B"),
    KnownPair("qwen3.5-27b", "z-lab/Qwen3.5-27B-DFlash", "Qwen/Qwen3.5-27B"),
    KnownPair("qwen3.5-35b-a3b", "z-lab/Qwen3.5-35B-A3B-DFlash", "Qwen/Qwen3.5-35B-A3B"),
    KnownPair("qwen3.5-122b-a10b", "z-lab/Qwen3.5-122B-A10B-DFlash", "Qwen/Qwen3.5-122B-A10B"),
    KnownPair("qwen3.6-27b", "z-lab/Qwen3.6-27B-DFlash", "Qwen/Qwen3.6-27B"),
    KnownPair("qwen3.6-35b-a3b", "z-lab/Qwen3.6-35B-A3B-DFlash", "Qwen/Qwen3.6-35B-A3B"),
    KnownPair("llama-3.1-8b-instruct", "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat", "meta-llama/Llama-3.1-8B-Instruct",
              aliases=("meta-llama-3.1-8b-instruct",)),  # the repo's name before Meta renamed it
    KnownPair("gpt-oss-20b", "z-lab/gpt-oss-20b-DFlash", "openai/gpt-oss-20b"),
    KnownPair("gpt-oss-120b", "z-lab/gpt-oss-120b-DFlash", "openai/gpt-oss-120b"),
    KnownPair("gemma-4-26b-a4b-it", "z-lab/gemma-4-26B-A4B-it-DFlash", "google/gemma-4-26B-A4B-it"),
    KnownPair("gemma-4-31b-it", "z-lab/gemma-4-31B-it-DFlash", "google/gemma-4-31B-it"),
    # z-lab marks these "Preview" (and gates the downloads); their draft configs were not seen here
    KnownPair("kimi-k2.5", "z-lab/Kimi-K2.5-DFlash", "moonshotai/Kimi-K2.5"),
    KnownPair("kimi-k2.6", "z-lab/Kimi-K2.6-DFlash", "moonshotai/Kimi-K2.6"),
    KnownPair("minimax-m2.5", "z-lab/MiniMax-M2.5-DFlash", "MiniMaxAI/MiniMax-M2.5"),
    KnownPair("minimax-m2.7", "z-lab/MiniMax-M2.7-DFlash", "MiniMaxAI/MiniMax-M2.7"),
)

# Targets with no draft of their own that use another model's draft on purpose. The draft
# still fits (same shapes, same tokenizer) and decoding stays exactly the target's; only the
# acceptance may be lower, since the draft learned from the other model's outputs.
BORROWED: dict[str, tuple[str, str]] = {
    # the July 2025 updates of Qwen3-4B: same architecture and vocabulary as Qwen3-4B
    "qwen3-4b-instruct-2507": ("qwen3-4b", "Qwen3-4B-Instruct-2507 is an update of Qwen3-4B with the same shapes"),
    "qwen3-4b-thinking-2507": ("qwen3-4b", "Qwen3-4B-Thinking-2507 is an update of Qwen3-4B with the same shapes"),
}

# Targets left without a draft on purpose, and why (said by `doctor` and the load error).
NO_DRAFT_BECAUSE: dict[str, str] = {
    "qwen3-30b-a3b": "z-lab publishes a draft for Qwen3-Coder-30B-A3B only; it has the same shapes but learned "
                     "from the coder's outputs (pass it with --draft to try it)",
    "qwen3-30b-a3b-instruct-2507": "z-lab publishes a draft for Qwen3-Coder-30B-A3B only; it has the same shapes "
                                   "but learned from the coder's outputs (pass it with --draft to try it)",
    "qwen3-30b-a3b-thinking-2507": "z-lab publishes a draft for Qwen3-Coder-30B-A3B only; it has the same shapes "
                                   "but learned from the coder's outputs (pass it with --draft to try it)",
}

# canonical target name (lower case) -> z-lab draft repo on the Hugging Face hub
KNOWN_PAIRS: dict[str, str] = {p.key: p.draft for p in PAIRS}
# a hub repo id that runs each known pair as published (for the model picker)
SUGGESTED_TARGETS: dict[str, str] = {p.key: p.suggested for p in PAIRS}
_BY_NAME: dict[str, KnownPair] = {name: p for p in PAIRS for name in (p.key, *p.aliases)}

# format / quantisation suffixes that do not change which draft fits; a DWQ conversion can
# carry its date (`-4bit-DWQ-053125`), a release date like `-2507` names another model and stays
_SUFFIX = re.compile(
    r"(-(mlx|\d+bit|\d+-bit|bf16|fp16|f16|fp8|int4|int8|q\d(_k(_[msl])?)?|dwq(-\d{6})?|mxfp\d|nvfp\d|awq|gptq"
    r"|dynamic|quantized|optimized))+$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class DraftChoice:
    """Which draft the registry gives a target, and why."""

    target: str
    key: str  # the target's canonical name
    draft: Optional[str]
    reason: str  # short: what was chosen
    note: str = ""  # longer: why, where it is not obvious
    exact: bool = False  # True: the draft was trained for this very model


def canonical_name(model: str) -> str:
    """`mlx-community/Qwen3-8B-4bit` -> `qwen3-8b`."""
    base = Path(model.rstrip("/")).name
    prev = None
    while prev != base:
        prev, base = base, _SUFFIX.sub("", base)
    return base.lower()


def choose_draft(model: str) -> DraftChoice:
    """The registry's draft for a target, with the reason in words."""
    key = canonical_name(model)
    pair = _BY_NAME.get(key)
    if pair is not None:
        return DraftChoice(model, key, pair.draft, f"the published draft for {pair.suggested}", exact=True)
    if key in BORROWED:
        base, why = BORROWED[key]
        owner = _BY_NAME[base]
        return DraftChoice(model, key, owner.draft, f"{owner.suggested}'s draft: none is published for {key}",
                           f"{why}; the output stays exactly the target's, acceptance may be lower")
    return DraftChoice(model, key, None, f"none known for {key}",
                       NO_DRAFT_BECAUSE.get(key, "no DFlash draft is published for it"))


def draft_for(model: str) -> Optional[str]:
    """The known draft for a target, or None."""
    return choose_draft(model).draft
