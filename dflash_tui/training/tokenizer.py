"""The demo target's byte-level BPE tokenizer, with ChatML special tokens and a mask token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]

# Qwen-style ChatML; `enable_thinking` is accepted and ignored.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def render_chat(prompt: str, response: str | None = None) -> str:
    """The text the chat template renders for one user turn (and the reply, ended by <|im_end|>)."""
    text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    if response is not None:
        text += f"{response}<|im_end|>\n"
    return text


def sample_texts(examples: Sequence[dict], max_chars: int) -> list[str]:
    """An evenly spread, deterministic sample of request + reply texts, about `max_chars` long."""
    total = sum(len(e["prompt"]) + len(e["response"]) for e in examples) or 1
    stride = max(1, round(total / max_chars))
    return [e["prompt"] + "\n" + e["response"] for e in examples[::stride]]


def train_tokenizer(texts: Iterable[str], out_dir: Path, vocab_size: int = 8192) -> dict[str, int]:
    """Train and write tokenizer.json + tokenizer_config.json (ChatML template); returns special ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    write_tokenizer_config(out_dir, ids)
    return ids


def write_tokenizer_config(out_dir: Path, ids: dict[str, int]) -> None:
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 32768,
        "added_tokens_decoder": {
            str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False, "normalized": False, "single_word": False}
            for t, i in ids.items()
        },
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=2) + "\n"
    )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
