"""Pick a target/draft pair: models in the Hugging Face cache, the registry's known pairs, the demo."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList
from textual.widgets.option_list import Option


@dataclass(frozen=True)
class ModelChoice:
    target: str
    draft: Optional[str]
    detail: str
    group: str  # "loaded" | "demo" | "cached" | "known"


def _human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit in ("B", "KB") else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _is_draft(snapshot: Path) -> bool:
    try:
        cfg = json.loads((snapshot / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return "DFlash" in " ".join(cfg.get("architectures") or [])


def cached_models(cache_dir: Optional[Path] = None) -> list[ModelChoice]:
    """Models in the local Hugging Face cache; none (or no cache at all) is fine."""
    from huggingface_hub import scan_cache_dir

    from dflash_tui.engine.registry import draft_for

    try:
        info = scan_cache_dir(cache_dir)
    except Exception:  # no cache dir, unreadable cache: nothing to list
        return []
    repos = [r for r in info.repos if r.repo_type == "model"]
    cached = {r.repo_id for r in repos}
    choices = []
    for repo in sorted(repos, key=lambda r: r.repo_id.lower()):
        snapshots = sorted(repo.revisions, key=lambda rev: rev.last_modified, reverse=True)
        if snapshots and _is_draft(snapshots[0].snapshot_path):
            continue  # drafts are offered next to their targets
        draft = draft_for(repo.repo_id)
        if draft is None:
            note = "no known draft: the target alone, or type one below"
        else:
            note = f"draft {draft}" + ("" if draft in cached else " (not downloaded)")
        choices.append(ModelChoice(repo.repo_id, draft, f"{_human_size(repo.size_on_disk)} · {note}", "cached"))
    return choices


def known_pairs() -> list[ModelChoice]:
    from dflash_tui.engine.registry import KNOWN_PAIRS, SUGGESTED_TARGETS

    return [
        ModelChoice(SUGGESTED_TARGETS.get(name, name), draft, f"draft {draft} (downloads)", "known")
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
    return ModelChoice(str(target), str(draft), "the bundled offline demo pair", "demo")


class ModelPicker(ModalScreen[Optional[tuple[str, Optional[str]]]]):
    """Dismisses with (target, draft or None), or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: Optional[str] = None, cache_dir: Optional[Path] = None,
                 current_draft: Optional[str] = None) -> None:
        super().__init__()
        self.current = current
        self.current_draft = current_draft
        self.cache_dir = cache_dir  # None: the Hugging Face default
        self.choices: list[ModelChoice] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="picker"):
            yield Label("Load a model", id="picker-title")
            yield Label("Models in your Hugging Face cache, the known DFlash pairs, or any path / repo id.",
                        id="picker-hint")
            yield OptionList(id="picker-list")
            with Horizontal(classes="picker-row"):
                yield Label("target", classes="picker-label")
                yield Input(placeholder="path or owner/name", id="picker-target")
            with Horizontal(classes="picker-row"):
                yield Label("draft", classes="picker-label")
                yield Input(placeholder="empty: the registry's draft for this target", id="picker-draft")
            with Horizontal(id="picker-buttons"):
                yield Button("Load", variant="primary", id="picker-load")
                yield Button("Cancel", id="picker-cancel")

    def on_mount(self) -> None:
        self.query_one(OptionList).loading = True
        self._scan()

    @work(thread=True, exclusive=True)
    def _scan(self) -> None:
        # a filesystem walk, no MLX: fine off the engine thread
        loaded = ModelChoice(self.current, self.current_draft, f"draft {self.current_draft or 'none'}", "loaded") if self.current else None
        choices = [c for c in [loaded, demo_pair()] if c] + cached_models(self.cache_dir) + known_pairs()
        self.app.call_from_thread(self._show, choices)

    def _show(self, choices: list[ModelChoice]) -> None:
        self.choices = choices
        options = self.query_one(OptionList)
        options.loading = False
        titles = {"loaded": "loaded now", "demo": "demo", "cached": "in your cache", "known": "known pair"}
        for i, choice in enumerate(choices):
            prompt = Text.assemble(
                ("● " if choice.group == "loaded" else "  "),
                (choice.target, "bold"),
                (f"  {titles[choice.group]} · {choice.detail}", "dim"),
            )
            options.add_option(Option(prompt, id=str(i)))
        if not any(c.group == "cached" for c in choices):
            self.query_one("#picker-hint", Label).update(
                "No models in your Hugging Face cache. Pick a known pair (it downloads) or type a path / repo id.")
        options.focus()

    @on(OptionList.OptionHighlighted)
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        choice = self.choices[int(event.option.id)]
        self.query_one("#picker-target", Input).value = choice.target
        self.query_one("#picker-draft", Input).value = choice.draft or ""

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        self._highlighted(event)  # type: ignore[arg-type]
        self._load()

    @on(Input.Submitted)
    @on(Button.Pressed, "#picker-load")
    def _load(self) -> None:
        target = self.query_one("#picker-target", Input).value.strip()
        draft = self.query_one("#picker-draft", Input).value.strip() or None
        if not target:
            self.notify("Type a model path or repo id, or pick one from the list", severity="warning")
            return
        self.dismiss((target, draft))

    @on(Button.Pressed, "#picker-cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
