"""Pick a target/draft pair: models in the Hugging Face cache, the registry's known pairs, the demo, a
remote engine from config.toml; with a remote engine in use, one of the models its server lists."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList
from textual.widgets.option_list import Option

from dflash_tui.ui.model_sources import (NO_ANSWER, OFFLINE, ModelChoice, cache_sizes, hub_offline, model_choices,
                                         remote_choice, server_models, with_download_size)

TITLES = {"loaded": "loaded now", "demo": "demo", "cached": "in your cache", "known": "known pair",
          "remote": "remote", "server": "on the server"}


class ModelPicker(ModalScreen[Optional[tuple[str, Optional[str]]]]):
    """Dismisses with (target, draft or None), or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: Optional[str] = None, cache_dir: Optional[Path] = None,
                 current_draft: Optional[str] = None, server: Any = None, remote_url: Optional[str] = None) -> None:
        """`server`: the RemoteTarget in use: its server's models are the choices (nothing loads here).
        `remote_url`: config.toml's remote engine, offered beside the local models."""
        super().__init__()
        self.current = current
        self.current_draft = current_draft
        self.cache_dir = cache_dir  # None: the Hugging Face default
        self.server = server
        self.remote_url = remote_url
        self.choices: list[ModelChoice] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="picker"):
            if self.server is not None:
                yield Label("Pick the server's model", id="picker-title")
                yield Label(f"The models {self.server.url} serves; the engine stays there.", id="picker-hint")
            else:
                yield Label("Load a model", id="picker-title")
                yield Label("Models in your Hugging Face cache, the known DFlash pairs, or any path / repo id"
                            " (or a server's http:// URL).", id="picker-hint")
            yield OptionList(id="picker-list")
            with Horizontal(classes="picker-row"):
                yield Label("target" if self.server is None else "model", classes="picker-label")
                yield Input(placeholder="path or owner/name" if self.server is None else "a model the server serves",
                            id="picker-target")
            with Horizontal(classes="picker-row"):
                yield Label("draft", classes="picker-label")
                yield Input(placeholder="empty: the registry's draft for this target" if self.server is None
                            else "the server's own", id="picker-draft", disabled=self.server is not None)
            with Horizontal(id="picker-buttons"):
                yield Button("Load", variant="primary", id="picker-load")
                yield Button("Cancel", id="picker-cancel")

    def on_mount(self) -> None:
        self.query_one(OptionList).loading = True
        self._scan()

    @work(thread=True, exclusive=True)
    def _scan(self) -> None:
        if self.server is not None:  # one request to the server, off the UI thread
            from dflash_tui.remote.client import RemoteError

            try:
                choices = server_models(self.server, self.current)
            except (RemoteError, ValueError) as exc:
                self.app.call_from_thread(self._show, [], str(exc))
                return
            self.app.call_from_thread(self._show, choices)
            return
        # a filesystem walk, no MLX: fine off the engine thread
        choices = model_choices(self.current, self.current_draft, self.cache_dir)
        if self.remote_url:
            at = 1 if choices and choices[0].group == "loaded" else 0
            choices.insert(at, remote_choice(self.remote_url))
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
            (choice.name, "bold"),  # a name, never an install path (the input below takes the path)
            (f"  {TITLES[choice.group]} · {choice.detail}", "dim"),
        )

    def _resize(self, index: int, choice: ModelChoice) -> None:
        if index < len(self.choices) and self.is_attached:
            self.choices[index] = choice
            self.query_one(OptionList).replace_option_prompt_at_index(index, self._prompt(choice))

    def _show(self, choices: list[ModelChoice], problem: Optional[str] = None) -> None:
        self.choices = choices
        options = self.query_one(OptionList)
        options.loading = False
        for i, choice in enumerate(choices):
            options.add_option(Option(self._prompt(choice), id=str(i)))
        if self.server is not None:
            if problem is not None:  # the server's own words, as plain text
                self.query_one("#picker-hint", Label).update(Text(f"The server did not list its models: {problem}"))
        elif not any(c.group == "cached" for c in choices):
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
