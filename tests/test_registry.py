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
