"""What the model picker offers: the pair loaded now, the demo, the Hugging Face cache, the known pairs,
and a remote engine named in config.toml; with a remote engine in use, the models its server lists.

Each target is listed once, with its size and whether loading it downloads
anything. Only the sizes of downloads need the hub; offline they are unknown.
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from dflash_tui.model_names import model_label
from dflash_tui.ui.figure_text import fmt_bytes

if TYPE_CHECKING:
    from dflash_tui.remote.client import RemoteTarget

TARGET_PATTERNS = ("*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "tiktoken.model",
                   "*.txt", "*.jsonl", "*.jinja")  # what the engine fetches for a target (engine/loading.py)
DRAFT_PATTERNS = ("*.json", "*.safetensors")
HUB_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ModelChoice:
    target: str
    draft: Optional[str]
    detail: str
    group: str  # "loaded" | "demo" | "cached" | "known" | "remote" (config.toml's server) | "server" (its models)
    size: Optional[int] = None  # bytes on disk, or to download (None: not known)
    download: bool = False  # loading it fetches files from the hub first

    @property
    def name(self) -> str:
        """What the list calls the target: its name (model_names), never an install path; a server by its URL."""
        return self.target if self.group in ("remote", "server") else model_label(self.target)


def human_size(n: int) -> str:
    """Bytes in binary units, named as such (MiB), as the meter shows memory."""
    return fmt_bytes(n)


def dir_size(path: Path) -> Optional[int]:
    try:
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    except OSError:
        return None


def _is_draft(snapshot: Path) -> bool:
    try:
        cfg = json.loads((snapshot / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return "DFlash" in " ".join(cfg.get("architectures") or [])


def cache_sizes(cache_dir: Optional[Path]) -> dict[str, int]:
    """repo id -> bytes on disk, for the models in the Hugging Face cache."""
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir(cache_dir)
    except Exception:  # no cache dir, unreadable cache: nothing there
        return {}
    return {r.repo_id: r.size_on_disk for r in info.repos if r.repo_type == "model"}


def _draft_note(draft: Optional[str], cached: dict[str, int]) -> str:
    if draft is None:
        return "no known draft: the target alone, or type one below"
    if draft in cached:
        return f"draft {draft} ({human_size(cached[draft])}, cached)"
    if Path(draft).expanduser().is_dir():
        return f"draft {model_label(draft)}"
    return f"draft {draft} (needs a download)"


def cached_models(cache_dir: Optional[Path] = None) -> list[ModelChoice]:
    """Models in the local Hugging Face cache; none (or no cache at all) is fine."""
    from huggingface_hub import scan_cache_dir

    from dflash_tui.engine.registry import draft_for

    try:
        info = scan_cache_dir(cache_dir)
    except Exception:  # no cache dir, unreadable cache: nothing to list
        return []
    repos = [r for r in info.repos if r.repo_type == "model"]
    cached = {r.repo_id: r.size_on_disk for r in repos}
    choices = []
    for repo in sorted(repos, key=lambda r: r.repo_id.lower()):
        snapshots = sorted(repo.revisions, key=lambda rev: rev.last_modified, reverse=True)
        if snapshots and _is_draft(snapshots[0].snapshot_path):
            continue  # drafts are offered next to their targets
        draft = draft_for(repo.repo_id)
        download = draft is not None and draft not in cached
        detail = f"{human_size(repo.size_on_disk)} on disk · {_draft_note(draft, cached)}"
        choices.append(ModelChoice(repo.repo_id, draft, detail, "cached", repo.size_on_disk, download))
    return choices


def known_pairs(cached: Optional[dict[str, int]] = None) -> list[ModelChoice]:
    from dflash_tui.engine.registry import KNOWN_PAIRS, SUGGESTED_TARGETS

    cached = cached or {}
    return [
        ModelChoice(SUGGESTED_TARGETS.get(name, name), draft,
                    f"needs a download (size: asking the hub…) · {_draft_note(draft, cached)}", "known", None, True)
        for name, draft in KNOWN_PAIRS.items()
    ]


def demo_pair() -> Optional[ModelChoice]:
    try:
        from dflash_tui.demo import demo_draft_path, demo_target_path

        target, draft = Path(demo_target_path()), Path(demo_draft_path())
    except Exception:  # no demo pair in this build
        return None
    if not (target / "config.json").is_file():
        return None
    size = (dir_size(target) or 0) + (dir_size(draft) or 0)
    return ModelChoice(str(target), str(draft), f"{human_size(size)} on disk, no download · the bundled offline demo pair",
                       "demo", size)


def loaded_pair(target: str, draft: Optional[str], cached: dict[str, int], demo: Optional[ModelChoice]) -> ModelChoice:
    if demo is not None and Path(target).expanduser().resolve() == Path(demo.target).resolve():
        return replace(demo, group="loaded", draft=draft)
    path = Path(target).expanduser()
    size = dir_size(path) if path.is_dir() else cached.get(target)
    where = f"{human_size(size)} on disk · " if size is not None else ""
    return ModelChoice(target, draft, f"{where}draft {model_label(draft) if draft else 'none'}", "loaded", size)


def model_choices(current: Optional[str], current_draft: Optional[str],
                  cache_dir: Optional[Path] = None) -> list[ModelChoice]:
    """Every choice, each target once: loaded now, the demo, the cache, then the known pairs."""
    cached = cache_sizes(cache_dir)
    demo = demo_pair()
    found = ([loaded_pair(current, current_draft, cached, demo)] if current else []) + ([demo] if demo else [])
    found += cached_models(cache_dir) + known_pairs(cached)
    seen: set[str] = set()
    unique = []
    for choice in found:
        key = str(Path(choice.target).expanduser().resolve()) if Path(choice.target).expanduser().exists() \
            else choice.target.lower()
        if key not in seen:
            seen.add(key)
            unique.append(choice)
    return unique


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_size(repo: str, patterns: tuple[str, ...]) -> Optional[int]:
    """Bytes of the files the engine would fetch from `repo`; raises when the hub cannot be asked."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo, files_metadata=True, timeout=HUB_TIMEOUT_S)
    sizes = [s.size for s in info.siblings or [] if any(fnmatch.fnmatch(s.rfilename, p) for p in patterns)]
    return sum(x for x in sizes if x) if sizes else None


OFFLINE = "size unknown offline"
NO_ANSWER = "size unknown: no answer from the hub"


def with_download_size(choice: ModelChoice, cached: dict[str, int], unknown: Optional[str]) -> tuple[ModelChoice, bool]:
    """A known pair's detail with what it downloads (target and draft); `unknown`: do not ask the hub, say
    this instead. Also whether the hub answered (once it does not, the rest need not wait for it)."""
    note = _draft_note(choice.draft, cached)
    if unknown:
        return replace(choice, detail=f"needs a download ({unknown}) · {note}"), False
    try:
        total = hub_size(choice.target, TARGET_PATTERNS) or 0
        if choice.draft and choice.draft not in cached:
            total += hub_size(choice.draft, DRAFT_PATTERNS) or 0
    except Exception:  # offline, gated, renamed: the size stays unknown
        return replace(choice, detail=f"needs a download ({NO_ANSWER}) · {note}"), False
    return replace(choice, size=total, detail=f"needs a download of {human_size(total)} · {note}"), True


def is_url(text: str) -> bool:
    """A target that names a server (http:// or https://), not a model."""
    return text.strip().lower().startswith(("http://", "https://"))


def remote_choice(url: str) -> ModelChoice:
    """config.toml's remote engine, offered beside the local models: choosing it connects there."""
    return ModelChoice(url, None, "remote engine from config.toml · chat with its server's model", "remote")


def server_models(target: "RemoteTarget", current: Optional[str]) -> list[ModelChoice]:
    """The models the server lists (GET /v1/models), the one in use first; RemoteError in one line."""
    from dflash_tui.remote.client import RemoteClient, RemoteTarget

    client = RemoteClient(RemoteTarget(target.url, target.api_key, None))
    try:
        info = client.connect()
    finally:
        client.close()
    names = ([current] if current in info.models else []) + [m for m in info.models if m != current]
    where = info.where
    return [ModelChoice(name, None, where + (" · in use" if name == current else ""),
                        "loaded" if name == current else "server") for name in names]
