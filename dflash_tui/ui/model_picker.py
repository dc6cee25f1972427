"""Pick a target/draft pair: models in the Hugging Face cache, the registry's known pairs, the demo."""

from __future__ import annotations

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

from dflash_tui.ui.model_sources import (NO_ANSWER, OFFLINE, ModelChoice, cache_sizes, hub_offline, model_choices,
                                         with_download_size)

TITLES = {"loaded": "loaded now", "demo": "demo", "cached": "in your cache", "known": "known pair"}


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
        choices = model_choices(self.current, self.current_draft, self.cache_dir)
        self.app.call_from_thread(self._show, choices)
        # then what the known pairs would download, as the hub answers (offline: said at once)
        cached, unknown = cache_sizes(self.cache_dir), (OFFLINE if hub_offline() else None)
        for i, choice in enumerate(choices):
            if choice.group != "known":
                continue
            sized, answered = with_download_size(choice, cached, unknown)
            unknown = unknown or (None if answered else NO_ANSWER)
            self.app.call_from_thread(self._resize, i, sized)

    @staticmethod
    def _prompt(choice: ModelChoice) -> Text:
        # model names and paths come from the disk and the hub: plain Text, never markup
        return Text.assemble(
            ("● " if choice.group == "loaded" else "  "),
            (choice.target, "bold"),
            (f"  {TITLES[choice.group]} · {choice.detail}", "dim"),
        )

    def _resize(self, index: int, choice: ModelChoice) -> None:
        if index < len(self.choices) and self.is_attached:
            self.choices[index] = choice
            self.query_one(OptionList).replace_option_prompt_at_index(index, self._prompt(choice))

    def _show(self, choices: list[ModelChoice]) -> None:
        self.choices = choices
        options = self.query_one(OptionList)
        options.loading = False
        for i, choice in enumerate(choices):
            options.add_option(Option(self._prompt(choice), id=str(i)))
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
