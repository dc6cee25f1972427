"""config.toml: defaults, env-var dirs, bad files reported and never overwritten, keys kept on write."""

from __future__ import annotations

import tomllib

import pytest

from dflash_tui import config as cfgmod
from dflash_tui.config import BadValue, Config, VALIDATORS, config_path, data_dir, load_config, save_settings


def test_dirs_follow_the_env_vars(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_TUI_CONFIG_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("DFLASH_TUI_DATA_DIR", str(tmp_path / "d"))
    assert config_path() == tmp_path / "c" / "config.toml"
    assert data_dir() == tmp_path / "d"
    monkeypatch.delenv("DFLASH_TUI_CONFIG_DIR")
    assert cfgmod.config_dir() == cfgmod.platformdirs.user_config_path("dflash-tui")


def test_missing_file_gives_defaults_and_is_writable():
    loaded = load_config()
    assert loaded.config == Config()
    assert loaded.problems == [] and loaded.writable and loaded.message is None


def test_values_are_read(tmp_path):
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text('model = "m"\ndraft = "d"\ntemperature = 0.7\nblock_size = 8\ntheme = "dflash-light"\n')
    c = load_config().config
    assert (c.model, c.draft, c.temperature, c.block_size, c.theme) == ("m", "d", 0.7, 8, "dflash-light")
    assert c.generation()["block_size"] == 8


def test_invalid_toml_falls_back_and_is_never_overwritten():
    path = config_path()
    path.parent.mkdir(parents=True)
    broken = 'theme = "dflash-light"\nmax_tokens = [\n'
    path.write_text(broken)
    loaded = load_config()
    assert loaded.config == Config()
    assert "not valid TOML" in loaded.message and str(path) in loaded.message
    assert not loaded.writable
    with pytest.raises(PermissionError):
        save_settings(loaded, theme="dflash-amber")
    assert path.read_text() == broken


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge", "deep"])
def test_a_special_huge_or_deep_file_is_reported_at_once_and_left_alone(kind):
    import os
    import threading

    path = config_path()
    path.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(path)  # reading it would wait for a writer forever
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")  # reading it would fill the memory
    elif kind == "huge":
        path.write_text("# " + "x" * (2 << 20) + "\n")
    else:
        path.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")  # tomllib recurses once per level
    before = os.lstat(path)
    got = []
    reader = threading.Thread(target=lambda: got.append(load_config()), daemon=True)
    reader.start()
    reader.join(10)
    assert got, "load_config hung"
    loaded = got[0]
    assert loaded.config == Config() and not loaded.writable
    words = {"fifo": "not a regular file (a fifo)", "dev-zero": "not a regular file (a device)",
             "huge": "too big", "deep": "not valid TOML (RecursionError"}[kind]
    assert words in loaded.message and str(path) in loaded.message
    with pytest.raises(PermissionError):
        save_settings(loaded, theme="dflash-amber")
    after = os.lstat(path)  # left as it is: the same fifo, link or file
    assert (after.st_mode, after.st_size, after.st_mtime_ns) == (before.st_mode, before.st_size, before.st_mtime_ns)


def test_bad_values_fall_back_one_by_one():
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text('temperature = "hot"\nmax_tokens = 0\ntop_p = 0.5\nblock_size = 1\n')
    loaded = load_config()
    c = loaded.config
    assert c.temperature == 0.0 and c.max_tokens == 512 and c.block_size == "auto"
    assert c.top_p == 0.5  # the good one is kept
    for key in ("'temperature'", "'max_tokens'", "'block_size'"):
        assert key in loaded.message
    assert not loaded.writable
    assert loaded.given == {"top_p"}  # a bad value is no choice: its default stands


def test_unknown_keys_are_reported_and_kept_on_write():
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text('future_thing = 3\ntheme = "dflash-dark"\n')
    loaded = load_config()
    assert "unknown setting 'future_thing'" in loaded.message
    assert loaded.writable
    save_settings(loaded, theme="dflash-amber")
    data = tomllib.loads(path.read_text())
    assert data == {"future_thing": 3, "theme": "dflash-amber"}


def test_saving_a_setting_edits_its_key_in_place_and_keeps_the_comments():
    path = config_path()
    path.parent.mkdir(parents=True)
    text = ('# my settings, by hand\n'
            'theme = "dflash-dark"  # the dark one for now\n\n'
            '# the model I use most\n'
            'model = "org/m"\n')
    path.write_text(text)
    save_settings(load_config(), theme="dflash-amber")
    assert path.read_text() == text.replace('"dflash-dark"', '"dflash-amber"')


def test_save_creates_the_dir_and_validates():
    loaded = load_config()
    save_settings(loaded, theme="dflash-light", model="x/y")
    assert tomllib.loads(config_path().read_text()) == {"theme": "dflash-light", "model": "x/y"}
    with pytest.raises(BadValue):
        save_settings(loaded, max_tokens=-3)


@pytest.mark.parametrize(
    "key,good,want,bad",
    [("temperature", "0.7", 0.7, "-1"), ("top_p", "0.9", 0.9, "0"), ("block_size", "4", 4, "1"), ("max_tokens", "64", 64, "zero")],
)
def test_validators(key, good, want, bad):
    assert VALIDATORS[key](good) == want
    with pytest.raises(BadValue):
        VALIDATORS[key](bad)


def test_block_size_auto_is_the_default_and_parses(tmp_path):
    from dflash_tui.config import VALIDATORS, Config

    assert Config().block_size == "auto" and Config().generation()["block_size"] == "auto"
    assert VALIDATORS["block_size"]("AUTO") == "auto" and VALIDATORS["block_size"]("8") == 8


def test_saving_writes_through_a_link_and_keeps_the_files_permissions(tmp_path):
    real = tmp_path / "dotfiles" / "config.toml"
    real.parent.mkdir()
    real.write_text('theme = "dflash-dark"  # mine\n')
    real.chmod(0o644)
    path = config_path()
    path.parent.mkdir(parents=True)
    path.symlink_to(real)
    save_settings(load_config(), theme="dflash-light")
    assert path.is_symlink() and path.resolve() == real  # the link stays a link
    assert real.read_text() == 'theme = "dflash-light"  # mine\n'
    assert real.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in real.parent.iterdir()] == ["config.toml"]  # no temp file left
