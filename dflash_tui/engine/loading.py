"""Load a target (through mlx-lm) and its DFlash draft, and check that they fit."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import mlx.core as mx

from dflash_tui.engine.draft import DFlashDraft, load_draft
from dflash_tui.engine.registry import draft_for
from dflash_tui.engine.target import Target
from dflash_tui.errors import UserError

ProgressFn = Callable[[str, float], None]


@dataclass
class Pair:
    target: Target
    draft: Optional[DFlashDraft]
    target_name: str
    draft_name: Optional[str]


def _looks_like_repo_id(name: str) -> bool:
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and not Path(name).exists()


def target_source(model: str) -> str:
    """Check a --model argument without loading it: a model directory or a hub repo id."""
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise UserError(f"not a model directory (no config.json): {model}")
        try:
            cfg = json.loads((path / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"model config.json is unreadable: {model}: {exc}") from None
        if "DFlash" in " ".join(cfg.get("architectures") or []):
            raise UserError(f"{model} is a DFlash draft, not a target model; pass it as --draft")
        return str(path)
    if _looks_like_repo_id(model):
        return model
    raise UserError(f"model not found: {model} (no such directory, and not a hub repo id like owner/name)")


# what mlx_lm.load fetches from the hub; code files come along but run only with --trust-remote-code
TARGET_FILES = ["*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "tiktoken.model", "*.txt", "*.jsonl", "*.jinja"]


def progress_bar_class(report: ProgressFn, stage: str, lo: float, hi: float):
    """A silent tqdm class that turns huggingface_hub's file progress into `report(stage, fraction)`."""
    from tqdm.auto import tqdm

    class Progress(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True  # never draw on the terminal (the TUI owns it)
            super().__init__(*args, **kwargs)
            self.done = 0

        def update(self, n: float = 1) -> None:
            self.done += n or 0
            total = self.total or 0
            if total:
                report(stage, lo + (hi - lo) * min(1.0, self.done / total))

    return Progress


def fetch(repo: str, patterns: list[str], report: ProgressFn, stage: str, lo: float, hi: float) -> str:
    """Download (or find in the local cache) a hub repo's files, reporting progress."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo, allow_patterns=patterns, tqdm_class=progress_bar_class(report, stage, lo, hi))
    except Exception as exc:  # offline, no such repo, gated, disk full: one line for the user
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"could not fetch {repo} from the Hugging Face hub: {msg}") from None


def load_target(model: str, trust_remote_code: bool = False, progress: Optional[ProgressFn] = None) -> Target:
    """The target through `mlx_lm.load`, run by mlx-lm's own code."""
    import mlx_lm

    source = target_source(model)
    if progress is not None and source == model and _looks_like_repo_id(model):
        source = fetch(model, TARGET_FILES, progress, "downloading target", 0.0, 0.4)
    try:
        lm, tokenizer = mlx_lm.load(source, trust_remote_code=trust_remote_code)
    except UserError:
        raise
    except Exception as exc:  # mlx-lm raises many kinds for a bad model; the user needs one line
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"could not load model {model}: {msg}") from None
    target = Target(lm, tokenizer, name=model)
    if target.is_hybrid:
        # Gated DeltaNet state cannot be trimmed: it needs its own rollback
        from dflash_tui.engine.hybrid import HybridTarget

        target = HybridTarget(lm, tokenizer, name=model)
    return target


def check_fit(target: Target, draft: DFlashDraft) -> None:
    """Raise UserError saying exactly what does not fit."""
    c = draft.config
    problems = []
    if c.hidden_size != target.hidden_size:
        problems.append(f"hidden size {c.hidden_size} != target's {target.hidden_size}")
    if c.vocab_size != target.vocab_size:
        problems.append(f"vocab size {c.vocab_size} != target's {target.vocab_size}")
    if c.num_target_layers is not None and c.num_target_layers != target.num_layers:
        problems.append(f"num_target_layers {c.num_target_layers} != target's {target.num_layers} layers")
    bad = [i for i in c.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        problems.append(f"target_layer_ids {bad} out of range for {target.num_layers} layers")
    if not 0 <= c.mask_token_id < target.vocab_size:
        problems.append(f"mask_token_id {c.mask_token_id} not in the target's vocab ({target.vocab_size})")
    if problems:
        raise UserError("draft does not fit the target: " + "; ".join(problems))


def load_pair(
    model: str,
    draft: Optional[str] = None,
    trust_remote_code: bool = False,
    progress: Optional[ProgressFn] = None,
    draft_dtype: mx.Dtype = mx.bfloat16,
    require_draft: bool = True,
) -> Pair:
    """Load target and draft for inference; `draft=None` looks the target up in the registry."""
    report = progress or (lambda stage, frac: None)
    target_source(model)
    draft_name = draft or draft_for(model)
    if draft_name is None and require_draft:
        raise UserError(f"no known DFlash draft for {model}; pass one with --draft")
    report("loading target", 0.0)
    target = load_target(model, trust_remote_code=trust_remote_code, progress=progress)
    dmodel = None
    if draft_name is not None:
        if progress is not None and _looks_like_repo_id(draft_name):
            draft_name_path = fetch(draft_name, ["*.json", "*.safetensors"], report, "downloading draft", 0.5, 0.9)
        else:
            draft_name_path = draft_name
        report("loading draft", 0.9)
        dmodel = load_draft(draft_name_path, dtype=draft_dtype)
        check_fit(target, dmodel)
        target.set_capture(dmodel.config.target_layer_ids)
    report("ready", 1.0)
    return Pair(target=target, draft=dmodel, target_name=model, draft_name=draft_name)
