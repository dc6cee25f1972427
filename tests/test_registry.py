import pytest

from dflash_tui.engine.registry import KNOWN_PAIRS, SUGGESTED_TARGETS, canonical_name, choose_draft, draft_for

Q3_4B, Q3_8B = "z-lab/Qwen3-4B-DFlash-b16", "z-lab/Qwen3-8B-DFlash-b16"
CODER, NEXT = "z-lab/Qwen3-Coder-30B-A3B-DFlash", "z-lab/Qwen3-Coder-Next-DFlash"
Q35 = {s: f"z-lab/Qwen3.5-{s}-DFlash" for s in ("4B", "9B", "27B", "35B-A3B", "122B-A10B")}
Q36 = {s: f"z-lab/Qwen3.6-{s}-DFlash" for s in ("27B", "35B-A3B")}
LLAMA = "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat"
OSS20, OSS120 = "z-lab/gpt-oss-20b-DFlash", "z-lab/gpt-oss-120b-DFlash"
G26, G31 = "z-lab/gemma-4-26B-A4B-it-DFlash", "z-lab/gemma-4-31B-it-DFlash"

# every name the registry supports: the published targets and the names people download
# (mlx-community / lmstudio-community conversions, Qwen's own MLX and FP8 builds)
SUPPORTED: dict[str, str] = {
    "Qwen/Qwen3-4B": Q3_4B, "Qwen/Qwen3-4B-MLX-4bit": Q3_4B, "Qwen/Qwen3-4B-MLX-6bit": Q3_4B,
    "Qwen/Qwen3-4B-MLX-8bit": Q3_4B, "Qwen/Qwen3-4B-MLX-bf16": Q3_4B, "Qwen/Qwen3-4B-FP8": Q3_4B,
    "Qwen/Qwen3-4B-AWQ": Q3_4B, "mlx-community/Qwen3-4B-4bit": Q3_4B, "mlx-community/Qwen3-4B-6bit": Q3_4B,
    "mlx-community/Qwen3-4B-8bit": Q3_4B, "mlx-community/Qwen3-4B-bf16": Q3_4B,
    "mlx-community/Qwen3-4B-4bit-DWQ": Q3_4B, "mlx-community/Qwen3-4B-4bit-DWQ-053125": Q3_4B,
    "Qwen/Qwen3-8B": Q3_8B, "Qwen/Qwen3-8B-MLX-4bit": Q3_8B, "Qwen/Qwen3-8B-FP8": Q3_8B,
    "mlx-community/Qwen3-8B-4bit": Q3_8B, "mlx-community/Qwen3-8B-6bit": Q3_8B, "mlx-community/Qwen3-8B-8bit": Q3_8B,
    "mlx-community/Qwen3-8B-4bit-DWQ": Q3_8B,
    # no draft is published for the 2507 updates of Qwen3-4B: they borrow Qwen3-4B's (see BORROWED)
    "Qwen/Qwen3-4B-Instruct-2507": Q3_4B, "Qwen/Qwen3-4B-Instruct-2507-FP8": Q3_4B,
    "mlx-community/Qwen3-4B-Instruct-2507-4bit": Q3_4B, "Qwen/Qwen3-4B-Thinking-2507": Q3_4B,
    "Qwen/Qwen3-Coder-30B-A3B-Instruct": CODER, "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8": CODER,
    "mlx-community/Qwen3-Coder-30B-A3B-Instruct-4bit": CODER, "mlx-community/Qwen3-Coder-30B-A3B-Instruct-8bit": CODER,
    "lmstudio-community/Qwen3-Coder-30B-A3B-Instruct-MLX-4bit": CODER,
    "Qwen/Qwen3-Coder-Next": NEXT, "Qwen/Qwen3-Coder-Next-FP8": NEXT, "mlx-community/Qwen3-Coder-Next-4bit": NEXT,
    "mlx-community/Qwen3-Coder-Next-8bit": NEXT, "mlx-community/Qwen3-Coder-Next-mxfp4": NEXT,
    "Qwen/Qwen3.5-4B": Q35["4B"], "mlx-community/Qwen3.5-4B-4bit": Q35["4B"],
    "Qwen/Qwen3.5-9B": Q35["9B"], "mlx-community/Qwen3.5-9B-MLX-4bit": Q35["9B"], "mlx-community/Qwen3.5-9B-8bit": Q35["9B"],
    "Qwen/Qwen3.5-27B": Q35["27B"], "Qwen/Qwen3.5-27B-FP8": Q35["27B"], "mlx-community/Qwen3.5-27B-4bit": Q35["27B"],
    "Qwen/Qwen3.5-35B-A3B": Q35["35B-A3B"], "Qwen/Qwen3.5-35B-A3B-FP8": Q35["35B-A3B"],
    "mlx-community/Qwen3.5-35B-A3B-4bit": Q35["35B-A3B"], "/models/Qwen3.5-35B-A3B-8bit/": Q35["35B-A3B"],
    "Qwen/Qwen3.5-122B-A10B": Q35["122B-A10B"], "mlx-community/Qwen3.5-122B-A10B-4bit": Q35["122B-A10B"],
    "Qwen/Qwen3.6-27B": Q36["27B"], "Qwen/Qwen3.6-27B-FP8": Q36["27B"], "mlx-community/Qwen3.6-27B-4bit": Q36["27B"],
    "mlx-community/Qwen3.6-27B-8bit": Q36["27B"], "Qwen/Qwen3.6-35B-A3B": Q36["35B-A3B"],
    "mlx-community/Qwen3.6-35B-A3B-4bit": Q36["35B-A3B"],
    "meta-llama/Llama-3.1-8B-Instruct": LLAMA, "meta-llama/Meta-Llama-3.1-8B-Instruct": LLAMA,
    "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit": LLAMA, "mlx-community/Meta-Llama-3.1-8B-Instruct-8bit": LLAMA,
    "mlx-community/Llama-3.1-8B-Instruct-4bit": LLAMA,
    "openai/gpt-oss-20b": OSS20, "mlx-community/gpt-oss-20b-MXFP4-Q8": OSS20, "mlx-community/gpt-oss-20b-MXFP4-Q4": OSS20,
    "lmstudio-community/gpt-oss-20b-MLX-8bit": OSS20,
    "openai/gpt-oss-120b": OSS120, "mlx-community/gpt-oss-120b-MXFP4-Q4": OSS120,
    "google/gemma-4-26B-A4B-it": G26, "mlx-community/gemma-4-26b-a4b-it-4bit": G26,
    "mlx-community/gemma-4-26b-a4b-it-8bit": G26,
    "google/gemma-4-31B-it": G31, "mlx-community/gemma-4-31b-it-4bit": G31,
    "moonshotai/Kimi-K2.5": "z-lab/Kimi-K2.5-DFlash", "moonshotai/Kimi-K2.6": "z-lab/Kimi-K2.6-DFlash",
    "MiniMaxAI/MiniMax-M2.5": "z-lab/MiniMax-M2.5-DFlash", "MiniMaxAI/MiniMax-M2.7": "z-lab/MiniMax-M2.7-DFlash",
}

# names that get no draft, on purpose: other models, base models, GGUF files mlx-lm cannot load
UNSUPPORTED = ["Qwen/Qwen3-8B-Base", "mlx-community/Qwen3-14B-4bit", "Qwen/Qwen3-30B-A3B-Instruct-2507",
               "mlx-community/Qwen3-30B-A3B-4bit", "Qwen/Qwen3.5-27B-GGUF", "google/gemma-4-26B-A4B",
               "mlx-community/Qwen2.5-7B-Instruct-4bit"]


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_every_supported_name_maps_to_its_draft(name):
    assert draft_for(name) == SUPPORTED[name]


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_names_without_a_draft_say_why(name):
    choice = choose_draft(name)
    assert choice.draft is None and choice.reason.startswith("none known for") and choice.note


def test_every_published_draft_is_reachable_and_borrowed_ones_say_so():
    assert set(KNOWN_PAIRS.values()) == set(SUPPORTED.values())
    assert choose_draft("Qwen/Qwen3-8B").exact
    borrowed = choose_draft("mlx-community/Qwen3-4B-Instruct-2507-4bit")
    assert not borrowed.exact and "none is published" in borrowed.reason and "acceptance may be lower" in borrowed.note
    # the coder's draft fits Qwen3-30B-A3B's shapes but is not given to it silently
    assert "Qwen3-Coder-30B-A3B" in choose_draft("Qwen/Qwen3-30B-A3B-Instruct-2507").note


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
