"""Load a target (through mlx-lm) and its DFlash draft, and check that they fit."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import mlx.core as mx

from dflash_tui.engine.draft import DFlashDraft, load_draft, resolve_checkpoint
from dflash_tui.engine.registry import draft_for
from dflash_tui.engine.target import Target
from dflash_tui.errors import UserError

if TYPE_CHECKING:
    from dflash_tui.engine.distributed import Ranks

ProgressFn = Callable[[str, float], None]


@dataclass
class Pair:
    target: Target
    draft: Optional[DFlashDraft]
    target_name: str
    draft_name: Optional[str]
    draft_quant: int = 0  # bits of the draft's linear layers (0: as loaded)


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


def load_target(model: str, trust_remote_code: bool = False, progress: Optional[ProgressFn] = None,
                source: Optional[str] = None, ranks: Optional["Ranks"] = None) -> Target:
    """The target through `mlx_lm.load`, run by mlx-lm's own code; `source`: where `locate_pair`
    found it; with `ranks`, through mlx-lm's `sharded_load`, this rank's shard of it
    (engine/distributed.py)."""
    import mlx_lm

    source = source or target_source(model)
    if progress is not None and source == model and _looks_like_repo_id(model) and ranks is None:
        source = fetch(model, TARGET_FILES, progress, "downloading target", 0.0, 0.4)
    _check_vocab_rows(model, Path(source))
    try:
        if ranks is not None:
            from dflash_tui.engine.distributed import load_sharded

            lm, tokenizer = load_sharded(source, ranks.kind, ranks.group, trust_remote_code=trust_remote_code)
        else:
            lm, tokenizer = mlx_lm.load(source, trust_remote_code=trust_remote_code)
    except UserError:
        raise
    except Exception as exc:  # mlx-lm raises many kinds for a bad model; the user needs one line
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"could not load model {model}: {msg}") from None
    if not _tokenizer_works(tokenizer):  # without its files, transformers hands back an empty tokenizer
        raise UserError(f"{model} has no usable tokenizer (no tokenizer.json or tokenizer.model?)")
    target = Target(lm, tokenizer, name=model)
    if target.is_hybrid:
        # Gated DeltaNet state cannot be trimmed: it needs its own rollback
        from dflash_tui.engine.hybrid import HybridTarget

        target = HybridTarget(lm, tokenizer, name=model)
    return target


def _tokenizer_works(tokenizer) -> bool:
    try:
        return len(tokenizer.encode("Hello, world")) > 0
    except Exception:  # a tokenizer that cannot encode is as good as none
        return False


def check_fit(target: Target, draft: DFlashDraft) -> None:
    """Raise UserError naming every check the pair fails (see engine.fit)."""
    from dflash_tui.engine.fit import failed, fit_checks

    bad = failed(fit_checks(draft.config, target.hidden_size, target.vocab_size, target.num_layers))
    if bad:
        raise UserError("draft does not fit the target: " + "; ".join(c.detail for c in bad))


DRAFT_FILES = ["*.json", "*.safetensors"]


@dataclass
class PairFiles:
    """Where a pair's files are: found, or downloaded, before anything is loaded into memory."""

    model: str  # as named
    target: str  # a local directory, or the repo id itself for mlx-lm to fetch
    draft_name: Optional[str]
    draft: Optional[str]  # a local directory, or a repo id


def locate_pair(model: str, draft: Optional[str] = None, progress: Optional[ProgressFn] = None,
                require_draft: bool = True) -> PairFiles:
    """Check names, fetch hub files (with `progress`) and check that a local draft fits, loading no
    weights: a typo, an offline hub id or a draft built for another model fails here, while the pair
    in use stays loaded."""
    report = progress or (lambda stage, frac: None)
    source = target_source(model)
    draft_name = draft or draft_for(model)
    if draft_name is None and require_draft:
        raise UserError(f"no known DFlash draft for {model}; pass one with --draft")
    if progress is not None and source == model and _looks_like_repo_id(model):
        source = fetch(model, TARGET_FILES, progress, "downloading target", 0.0, 0.4)
    draft_path = draft_name
    if draft_name is not None:
        if _looks_like_repo_id(draft_name):
            if progress is not None:
                draft_path = fetch(draft_name, DRAFT_FILES, report, "downloading draft", 0.4, 0.5)
        else:
            draft_path = str(resolve_checkpoint(draft_name, allow_download=False))
    if draft_path is not None and Path(source).is_dir() and Path(draft_path).is_dir():
        _check_fit_from_files(Path(source), Path(draft_path))
    return PairFiles(model, source, draft_name, draft_path)


def _check_vocab_rows(model: str, folder: Path) -> None:
    """The embedding's rows against vocab_size before loading: mlx-lm's sharded load does not compare
    shapes, so there a mismatch would load and write nonsense instead of failing."""
    from dflash_tui.engine.facts import CheckpointError, check_vocab_rows

    try:
        check_vocab_rows(folder)
    except CheckpointError as exc:
        raise UserError(f"could not load model {model}: {exc}") from None
    except Exception:  # unreadable or unusual files: the real load says what is wrong with them
        return


def _check_fit_from_files(target: Path, draft: Path) -> None:
    """The fit checks from config files and weight headers; files that cannot be read are left to the load
    to report."""
    from dflash_tui.engine.facts import draft_facts, target_facts
    from dflash_tui.engine.fit import failed, fit_checks

    try:
        t, d = target_facts(target), draft_facts(draft)
    except Exception:  # unreadable or unusual files: the real load says what is wrong with them
        return
    bad = failed(fit_checks(d.config, t.hidden_size, t.vocab_size, t.num_layers))
    if bad:
        raise UserError("draft does not fit the target: " + "; ".join(c.detail for c in bad))


def load_located(files: PairFiles, trust_remote_code: bool = False, progress: Optional[ProgressFn] = None,
                 draft_dtype: mx.Dtype = mx.bfloat16, ranks: Optional["Ranks"] = None, draft_quant: int = 0) -> Pair:
    """Load what `locate_pair` found; `draft_quant` 4 or 8 quantizes the draft's linear layers
    (engine/draft_quant.py)."""
    report = progress or (lambda stage, frac: None)
    report("loading target", 0.5)
    target = load_target(files.model, trust_remote_code=trust_remote_code, progress=progress, source=files.target,
                         ranks=ranks)
    dmodel = None
    if files.draft is not None:
        report("loading draft", 0.9)
        dmodel = load_draft(files.draft, dtype=draft_dtype)
        check_fit(target, dmodel)
        if draft_quant:
            from dflash_tui.engine.draft_quant import quantize_draft

            quantize_draft(dmodel, draft_quant)
        target.set_capture(dmodel.config.target_layer_ids)
    report("ready", 1.0)
    return Pair(target=target, draft=dmodel, target_name=files.model, draft_name=files.draft_name,
                draft_quant=draft_quant if dmodel is not None else 0)


def load_pair(
    model: str,
    draft: Optional[str] = None,
    trust_remote_code: bool = False,
    progress: Optional[ProgressFn] = None,
    draft_dtype: mx.Dtype = mx.bfloat16,
    require_draft: bool = True,
    ranks: Optional["Ranks"] = None,
    draft_quant: int = 0,
) -> Pair:
    """Load target and draft for inference; `draft=None` looks the target up in the registry."""
    files = locate_pair(model, draft, progress, require_draft)
    return load_located(files, trust_remote_code, progress, draft_dtype, ranks=ranks, draft_quant=draft_quant)
