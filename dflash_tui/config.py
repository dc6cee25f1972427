"""User settings and where files live: config.toml (tomllib read; tomlkit edits keys in place).

A config file that cannot be read, or holds bad values, is reported and left
untouched: the run uses defaults for what is wrong and never writes the file.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Optional, Union

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

import platformdirs

APP_NAME = "dflash-tui"
DEFAULT_THEME = "dflash-dark"


# -- paths ---------------------------------------------------------------------
def config_dir() -> Path:
    """`$DFLASH_TUI_CONFIG_DIR`, else the platform's user config dir."""
    env = os.environ.get("DFLASH_TUI_CONFIG_DIR")
    return Path(env).expanduser() if env else platformdirs.user_config_path(APP_NAME)


def data_dir() -> Path:
    """`$DFLASH_TUI_DATA_DIR`, else the platform's user data dir (sessions live here)."""
    env = os.environ.get("DFLASH_TUI_DATA_DIR")
    return Path(env).expanduser() if env else platformdirs.user_data_path(APP_NAME)


def cache_dir() -> Path:
    """`$DFLASH_TUI_CACHE_DIR`, else the platform's user cache dir (saved conversation caches live here)."""
    env = os.environ.get("DFLASH_TUI_CACHE_DIR")
    return Path(env).expanduser() if env else platformdirs.user_cache_path(APP_NAME)


def config_path() -> Path:
    return config_dir() / "config.toml"


def user_themes_dir() -> Path:
    return config_dir() / "themes"


# -- validation (shared with the slash commands) -----------------------------
class BadValue(ValueError):
    """A setting value that is out of range or of the wrong type; the message says which."""


def _int(lo: int, hi: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            try:
                v = int(str(v).strip())
            except ValueError:
                raise BadValue(f"expected a whole number, got {v!r}") from None
        if not lo <= v <= hi:
            raise BadValue(f"must be between {lo} and {hi}, got {v}")
        return v

    return check


def _float(lo: float, hi: float, open_low: bool = False) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        if isinstance(v, bool):
            raise BadValue(f"expected a number, got {v!r}")
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise BadValue(f"expected a number, got {v!r}") from None
        if v != v or v > hi or v < lo or (open_low and v == lo):
            low = f"above {lo}" if open_low else f"at least {lo}"
            raise BadValue(f"must be {low} and at most {hi}, got {v:g}")
        return v

    return check


def _block(v: Any):
    if isinstance(v, str) and v.strip().lower() == "auto":
        return "auto"
    v = _int(0, 256)(v)
    if v == 1:
        raise BadValue("must be 0 (the draft's own size) or at least 2; use /baseline for the target alone")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise BadValue(f"expected text, got {v!r}")
    return v


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("1", "true", "on", "yes"):
        return True
    if text in ("0", "false", "off", "no"):
        return False
    raise BadValue(f"expected true or false, got {v!r}")


def _draft_quant(v: Any) -> int:
    v = _int(0, 8)(v)
    if v not in (0, 4, 8):
        raise BadValue(f"must be 0 (as shipped), 4 or 8 bits, got {v}")
    return v


def _seed(v: Any) -> int:
    return _int(-1, 2**31 - 1)(v)


VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "model": _str,
    "draft": _str,
    "theme": _str,
    "system": _str,
    "max_tokens": _int(1, 1_000_000),
    "block_size": _block,
    "temperature": _float(0.0, 10.0),
    "top_p": _float(0.0, 1.0, open_low=True),
    "top_k": _int(0, 1_000_000),
    "min_p": _float(0.0, 1.0),
    "seed": _seed,
    "baseline_probe_tokens": _int(0, 1024),
    "trust_remote_code": _bool,
    "draft_quant": _draft_quant,
    "prompt_cache_gb": _float(0.0, 10_000.0),
    "remote": _str,
    "api_key": _str,
}


@dataclass
class Config:
    model: str = ""  # default target ("" = none configured)
    draft: str = ""  # default draft ("" = the registry's pick for the target)
    theme: str = DEFAULT_THEME
    system: str = ""  # default system prompt
    max_tokens: int = 512
    block_size: Union[int, str] = "auto"  # "auto" = adaptive; 0 = the draft's own block size
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0  # 0 = off
    seed: int = -1  # -1 = no fixed seed
    baseline_probe_tokens: int = 32  # a short target-only run after load measures the speedup; 0 = off
    trust_remote_code: bool = False
    draft_quant: int = 0  # 4 or 8: the draft's linear layers quantized at load (0 = as shipped)
    prompt_cache_gb: float = 2.0  # saved conversation caches on disk, oldest out past this (0 = none saved)
    remote: str = ""  # an OpenAI-compatible server's URL: the engine runs there ("" = here, on MLX)
    api_key: str = ""  # its key, if it wants one (never written to a session)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def generation(self) -> dict[str, Any]:
        """The part that becomes the engine's GenerationSettings."""
        return {
            "max_tokens": self.max_tokens,
            "block_size": self.block_size or None,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "seed": None if self.seed < 0 else self.seed,
        }


@dataclass
class LoadedConfig:
    config: Config
    path: Path
    problems: list[str] = field(default_factory=list)
    # False when the file exists but is broken: we must not overwrite what the user wrote
    writable: bool = True
    given: set[str] = field(default_factory=set)  # the settings the user chose: in the file, or by a flag

    @property
    def message(self) -> Optional[str]:
        if not self.problems:
            return None
        return f"{self.path}: " + "; ".join(self.problems) + " (using defaults for these; the file was left as it is)"


MAX_CONFIG_BYTES = 1 << 20  # a settings file of a few lines; anything near this is not one


def load_config(path: Optional[Path] = None) -> LoadedConfig:
    """Read config.toml; never raises for a bad file (the problems are listed instead)."""
    from dflash_tui.files import read_regular_file

    path = path or config_path()
    cfg = Config()
    if not path.exists():
        return LoadedConfig(cfg, path)
    try:  # a regular file of a sane size: a fifo would wait forever, /dev/zero would fill the memory
        raw = tomllib.loads(read_regular_file(path, MAX_CONFIG_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return LoadedConfig(cfg, path, [f"cannot be read ({exc.__class__.__name__}: {exc})"], writable=False)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:  # RecursionError: arrays nested thousands deep
        return LoadedConfig(cfg, path, [f"is not valid TOML ({exc.__class__.__name__}: {exc})"], writable=False)
    problems, bad_values, given = [], False, set()
    known = {f.name for f in fields(Config)}
    for key, value in raw.items():
        if key not in known:  # kept as is on write, so the file stays writable
            problems.append(f"unknown setting '{key}' ignored")
            continue
        try:
            setattr(cfg, key, VALIDATORS[key](value))
        except BadValue as exc:
            problems.append(f"'{key}' {exc}")
            bad_values = True
            continue
        given.add(key)
    return LoadedConfig(cfg, path, problems, writable=not bad_values, given=given)


def save_settings(loaded: LoadedConfig, **changes: Any) -> None:
    """Write `changes` into config.toml, keeping everything else the user wrote: other keys, comments, order.

    Raises OSError when the directory is not writable and PermissionError when
    the file was found broken at start (it is never overwritten).
    """
    for key, value in changes.items():
        setattr(loaded.config, key, VALIDATORS[key](value))
    if not loaded.writable:
        raise PermissionError(f"{loaded.path} has problems, so it is left as it is; fix it to save settings")
    import tomlkit  # only when writing: reading is tomllib's

    doc = tomlkit.document()
    if loaded.path.exists():
        from dflash_tui.files import read_regular_file

        try:
            doc = tomlkit.parse(read_regular_file(loaded.path, MAX_CONFIG_BYTES).decode("utf-8"))
        except (ValueError, RecursionError):  # broken since it was read (tomlkit's ParseError, a bad encoding)
            raise PermissionError(f"{loaded.path} is no longer valid TOML, so it is left as it is") from None
    for key, value in changes.items():
        doc[key] = value  # an existing key keeps its place and its comment
    target = Path(os.path.realpath(loaded.path))  # a linked config (dotfiles) is written where it lives
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = stat.S_IMODE(os.stat(target).st_mode) if target.exists() else None
    # temp file + os.replace: a crash mid-write never leaves half a config
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".config-", suffix=".toml")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(tomlkit.dumps(doc).encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)  # the file's own permissions, not the temp file's 0600
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
