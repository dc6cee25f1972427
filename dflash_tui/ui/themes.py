"""Theme files (TOML) → `textual.theme.Theme`: the bundled ones plus the user's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from textual.color import Color, ColorParseError
from textual.theme import Theme

from dflash_tui.config import DEFAULT_THEME, MAX_CONFIG_BYTES, save_settings, user_themes_dir
from dflash_tui.files import read_regular_file

COLOR_KEYS = ("primary", "secondary", "accent", "warning", "error", "success", "foreground", "background", "surface", "panel", "boost")


class ThemeError(ValueError):
    pass


def bundled_themes_dir() -> Path:
    """`themes/` beside the package (a source checkout), else inside it (an installed wheel)."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parents[1] / "themes", here.parent / "themes"):
        if candidate.is_dir():
            return candidate
    return here.parents[1] / "themes"


def theme_from_dict(data: dict[str, Any], source: str = "theme") -> Theme:
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ThemeError(f"{source}: needs a 'name'")
    if "primary" not in data:
        raise ThemeError(f"{source}: needs a 'primary' colour")
    colors: dict[str, str] = {}
    for key in COLOR_KEYS:
        if key in data:
            value = data[key]
            try:
                Color.parse(value)
            except (ColorParseError, TypeError, ValueError):
                raise ThemeError(f"{source}: '{key}' is not a colour: {value!r}") from None
            colors[key] = value
    unknown = set(data) - set(COLOR_KEYS) - {"name", "dark", "variables", "luminosity_spread", "text_alpha"}
    if unknown:
        raise ThemeError(f"{source}: unknown keys {sorted(unknown)}")
    dark = data.get("dark", True)
    if not isinstance(dark, bool):
        raise ThemeError(f"{source}: 'dark' must be true or false")
    variables = data.get("variables", {})
    if not isinstance(variables, dict) or not all(isinstance(v, str) for v in variables.values()):
        raise ThemeError(f"{source}: 'variables' must be a table of strings")
    extra: dict[str, Any] = {}
    for key in ("luminosity_spread", "text_alpha"):
        if key in data:
            if isinstance(data[key], bool) or not isinstance(data[key], (int, float)):
                raise ThemeError(f"{source}: '{key}' must be a number")
            extra[key] = float(data[key])
    return Theme(name=name.strip(), dark=dark, variables=dict(variables), **colors, **extra)


def load_theme_file(path: Path) -> Theme:
    try:  # a regular file of a sane size: a fifo among the themes would hang the start
        data = tomllib.loads(read_regular_file(path, MAX_CONFIG_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ThemeError(f"{path}: cannot be read: {exc}") from None
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise ThemeError(f"{path}: not valid TOML: {exc.__class__.__name__}: {exc}") from None
    return theme_from_dict(data, str(path))


def load_themes(dirs: Optional[Iterable[Path]] = None) -> tuple[list[Theme], list[str]]:
    """Every *.toml theme in `dirs` (bundled, then the user's: later ones win); bad files are reported."""
    themes: dict[str, Theme] = {}
    problems: list[str] = []
    for folder in dirs if dirs is not None else (bundled_themes_dir(), user_themes_dir()):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.toml")):
            try:
                theme = load_theme_file(path)
            except ThemeError as exc:
                problems.append(str(exc))
                continue
            themes[theme.name] = theme
    return list(themes.values()), problems


class ThemeKeeping:
    """The app's part: register the themes, apply the configured one, write a change back to config.toml."""

    def _setup_themes(self) -> None:
        themes, problems = load_themes()
        for theme in themes:
            self.register_theme(theme)
        for problem in problems:
            self.notify(problem, title="theme", severity="warning", timeout=8)
        wanted = self.options.theme
        if wanted in self.available_themes:
            self.theme = wanted
        else:
            if wanted != DEFAULT_THEME:
                self.notify(f"no theme named '{wanted}'; using {DEFAULT_THEME}", severity="warning")
            self.theme = DEFAULT_THEME if DEFAULT_THEME in self.available_themes else "textual-dark"
        self._theme_at_start = self.theme
        self.theme_changed_signal.subscribe(self, self._theme_changed)

    def _theme_changed(self, theme: Theme) -> None:
        # setting up is not a choice: a fallback for a missing theme, or --theme's, stays out of the file
        if not self._theme_chosen and theme.name == self._theme_at_start:
            return
        self._theme_chosen = True
        self.options.theme = theme.name
        # the theme picker previews as you move: write once things settle
        if self._theme_save_timer is not None:
            self._theme_save_timer.stop()
        self._theme_save_timer = self.set_timer(0.8, self._save_theme)

    def _save_theme(self) -> None:
        self._theme_save_timer = None
        if not self._theme_chosen or self.options.theme == self.loaded_config.config.theme:
            return
        try:
            save_settings(self.loaded_config, theme=self.options.theme)
        except PermissionError as exc:
            self.notify(str(exc), title="theme not saved", severity="warning")
        except OSError as exc:
            self.notify(f"could not write {self.loaded_config.path}: {exc}", title="theme not saved", severity="error")
