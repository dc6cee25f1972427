"""Known target → DFlash draft pairs, matched on the model name.

`mlx-community/Qwen3-8B-4bit` and `Qwen/Qwen3-8B` both name the Qwen3-8B
target: the owner and quantisation/format suffixes are ignored.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

# canonical target name (lower case) -> z-lab draft repo on the Hugging Face hub
KNOWN_PAIRS: dict[str, str] = {
    "qwen3-4b": "z-lab/Qwen3-4B-DFlash-b16",
    "qwen3-8b": "z-lab/Qwen3-8B-DFlash-b16",
    "qwen3-coder-30b-a3b-instruct": "z-lab/Qwen3-Coder-30B-A3B-DFlash",
    "qwen3.5-4b": "z-lab/Qwen3.5-4B-DFlash",
    "qwen3.5-9b": "z-lab/Qwen3.5-9B-DFlash",
    "qwen3.5-27b": "z-lab/Qwen3.5-27B-DFlash",
    "qwen3.5-35b-a3b": "z-lab/Qwen3.5-35B-A3B-DFlash",
    "llama-3.1-8b-instruct": "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
    "gpt-oss-20b": "z-lab/gpt-oss-20b-DFlash",
}

# a hub repo id that runs each known pair as published (for the model picker)
SUGGESTED_TARGETS: dict[str, str] = {
    "qwen3-4b": "Qwen/Qwen3-4B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-coder-30b-a3b-instruct": "Qwen/Qwen3-Coder-30B-A3B-Instruct",
    "qwen3.5-4b": "Qwen/Qwen3.5-4B",
    "qwen3.5-9b": "Qwen/Qwen3.5-9B",
    "qwen3.5-27b": "Qwen/Qwen3.5-27B",
    "qwen3.5-35b-a3b": "Qwen/Qwen3.5-35B-A3B",
    "llama-3.1-8b-instruct": "meta-llama/Llama-3.1-8B-Instruct",
    "gpt-oss-20b": "openai/gpt-oss-20b",
}

# format / quantisation suffixes that do not change which draft fits
_SUFFIX = re.compile(
    r"(-(mlx|\d+bit|\d+-bit|bf16|fp16|f16|fp8|int4|int8|q\d(_k(_m)?)?|dwq|mxfp4|nvfp4|awq|gptq|quantized|optimized))+$",
    re.IGNORECASE,
)


def canonical_name(model: str) -> str:
    """`mlx-community/Qwen3-8B-4bit` -> `qwen3-8b`."""
    base = Path(model.rstrip("/")).name
    prev = None
    while prev != base:
        prev, base = base, _SUFFIX.sub("", base)
    return base.lower()


def draft_for(model: str) -> Optional[str]:
    """The known draft for a target, or None."""
    return KNOWN_PAIRS.get(canonical_name(model))
