"""/export from the chat app on the demo pair: YAML front matter with the pair's name and each reply's figures,
the reply's bare code fenced with its language, and the branch in view (not the other one)."""

from __future__ import annotations

import pytest

from ui_support import install_placeholders

install_placeholders()

from conftest import demo_pair_bundled  # noqa: E402
from test_ui_app import wait_for  # noqa: E402

yaml = pytest.importorskip("yaml")
pytestmark = [pytest.mark.anyio, pytest.mark.skipif(not demo_pair_bundled(), reason="no demo pair bundled")]

FIRST = "Wait until a predicate becomes true."  # held-out requests: the demo target answers with a function
SECOND = "Return the number of lines in a text file."


def front_and_body(md: str) -> tuple[dict, str]:
    assert md.startswith("---\n")
    head, _, body = md[4:].partition("\n---\n")
    return yaml.safe_load(head), body


async def test_export_from_the_app_has_front_matter_fenced_code_and_follows_the_branch_in_view(tmp_path):
    from dflash_tui.demo import demo_draft_path, demo_target_path
    from dflash_tui.ui.app import DFlashApp
    from dflash_tui.ui.chat_view import UserMessage

    app = DFlashApp(model=str(demo_target_path()), draft=str(demo_draft_path()), probe_tokens=0)
    app.options.max_tokens = 40
    app.options.block_size = 16
    out = tmp_path / "chat.md"
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state in ("ready", "failed"), 120, "the demo pair to load")
        assert app.model_state == "ready"
        app.prompt.value = FIRST
        app.prompt.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.session is not None and len(app.session.messages) == 2, 120, "reply 1")
        first_reply = app.session.messages[-1]

        # the request edited: a second branch, with its own reply
        app.chat.query(UserMessage).first().focus()
        await pilot.press("e")
        app.prompt.value = SECOND
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.session.tree.nodes) == 4 and not app.generating, 120, "the fork")
        await pilot.pause(0.2)
        # back to the first version, and export what is in view
        app.chat.query(UserMessage).first().focus()
        await pilot.press("left_square_bracket")
        await wait_for(pilot, lambda: [u.raw_text for u in app.chat.query(UserMessage)] == [FIRST], 10, "branch 1")
        app.prompt.focus()
        app.prompt.value = f"/export {out}"
        await pilot.press("enter")
        await wait_for(pilot, out.exists, 10, "the export")

    front, body = front_and_body(out.read_text(encoding="utf-8"))
    assert front["model"] == "demo (offline)" and front["draft"] == "demo (offline)"
    assert front["branches"] == 2 and front["messages"] == 2
    (reply,) = front["replies"]
    done = first_reply.done()
    assert reply["message"] == first_reply.id and reply["mode"] == "dflash"
    assert reply["tau"] == round(done.stats["tokens_per_cycle"], 3) and reply["tau"] > 1.0
    assert reply["acceptance"] == round(done.stats["acceptance"], 4) and reply["acceptance"] > 0
    assert reply["tok_s"] == round(done.stats["decode_tps"], 1) and reply["tokens"] == len(done.tokens)
    assert FIRST in body and SECOND not in body  # the branch in view
    assert first_reply.content.lstrip().startswith(("def ", "async def ", "@"))  # a bare-code reply …
    assert "```python\n" in body  # … fenced with its language
