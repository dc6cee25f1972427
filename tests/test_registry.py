from dflash_tui.engine.registry import KNOWN_PAIRS, SUGGESTED_TARGETS, canonical_name, draft_for


def test_quantised_and_community_names_find_their_draft():
    assert draft_for("mlx-community/Qwen3-8B-4bit") == "z-lab/Qwen3-8B-DFlash-b16"
    assert draft_for("Qwen/Qwen3-8B") == "z-lab/Qwen3-8B-DFlash-b16"
    assert draft_for("mlx-community/Qwen3.5-9B-MLX-4bit") == "z-lab/Qwen3.5-9B-DFlash"
    assert draft_for("/models/Qwen3.5-35B-A3B-8bit/") == "z-lab/Qwen3.5-35B-A3B-DFlash"


def test_other_models_have_no_draft():
    assert draft_for("mlx-community/Qwen3-14B-4bit") is None
    assert draft_for("Qwen/Qwen3-8B-Base") is None
    assert canonical_name("Qwen3-4B-Instruct-2507-bf16") == "qwen3-4b-instruct-2507"


def test_every_known_pair_has_a_suggested_target():
    assert set(KNOWN_PAIRS) == set(SUGGESTED_TARGETS)
    for key, repo in SUGGESTED_TARGETS.items():
        assert canonical_name(repo) == key


def test_hub_progress_becomes_fractions():
    from dflash_tui.engine.loading import progress_bar_class

    seen = []
    bar = progress_bar_class(lambda stage, frac: seen.append((stage, round(frac, 3))), "downloading target", 0.0, 0.4)(total=4)
    bar.update(1)
    bar.update(3)
    bar.close()
    assert seen == [("downloading target", 0.1), ("downloading target", 0.4)]


def test_offline_hub_fetch_is_one_clear_error(monkeypatch):
    import pytest

    from dflash_tui.engine.loading import fetch
    from dflash_tui.errors import UserError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="could not fetch nobody/no-such-model"):
        fetch("nobody/no-such-model", ["*.json"], lambda s, f: None, "downloading target", 0, 1)
