"""A turn that fails (TurnFailed, the engine's error) on the real app: ctrl+r then sends the failed
message again, its reply lands under it and is saved as a normal turn, and the meter keeps the
figures from before the failed reply. Real failures: the local engine refusing a prompt past the
model's context, and a real server (uvicorn, in a thread) whose stream breaks off mid-reply."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from ui_support import install_placeholders

install_placeholders()

from stall_server import ThreadServer  # noqa: E402
from test_ui_app import SIZE, finish_turn, make_app, ready, send, wait_for  # noqa: E402

from dflash_tui.sessions import SessionStore  # noqa: E402
from dflash_tui.ui.chat_view import AssistantMessage, MessageBlock, Note  # noqa: E402

pytestmark = pytest.mark.anyio
FLATTEN, PARSE = "Flatten a nested list.", "Parse an ISO date string."


def shown(app) -> list[tuple[str, str]]:
    """The chat as it reads: (role, or "note" for an error line, text), top to bottom."""
    out = []
    for w in app.chat.query("UserMessage, AssistantMessage, Note"):
        if isinstance(w, Note):
            if not w.has_class("-error"):
                continue  # "Loaded target…", and such
            out.append(("note", str(w.render())))
        elif isinstance(w, MessageBlock):
            out.append((w.ROLE, w.raw_text))
    return out


def saved(app) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in SessionStore().load(app.session.id).messages]


async def regenerate(pilot, app) -> None:
    """ctrl+r, and the turn it starts (however quick) to finish."""
    before = app.turn_id
    await pilot.press("ctrl+r")
    await wait_for(pilot, lambda: app.turn_id > before, 10, "ctrl+r to start a turn")
    await finish_turn(pilot, app)


def meter_text(app) -> str:
    return "\n".join(str(w.render()) for w in app.meter.query("MeterText"))


# -- the local engine: a real refusal (the prompt is past the model's context) ----------------------
async def test_ctrl_r_after_a_failed_turn_sends_that_message_again(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 6
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, app, FLATTEN)
        await finish_turn(pilot, app)
        first = app.chat.last_assistant().raw_text
        args = app.engine.conversation.target.args
        context = args.max_position_embeddings
        args.max_position_embeddings = 64  # the model's own setting, as a small model has it
        question = PARSE + " 2024-01-02T03:04:05Z" * 20
        await send(pilot, app, question)
        await finish_turn(pilot, app)
        assert app.chat.query(AssistantMessage).last().query_one(".message-footer").render().plain == "failed"
        assert any("the model's context is 64 tokens" in t for r, t in shown(app) if r == "note")
        assert saved(app) == [("user", FLATTEN), ("assistant", first)]  # nothing of the failed turn

        args.max_position_embeddings = context  # room again: the retry can be answered
        await regenerate(pilot, app)
        retried = app.chat.last_assistant().raw_text
        assert retried
        # the question shown last has the new reply right under it; the failed reply and its note are gone
        assert shown(app) == [("you", FLATTEN), ("assistant", first), ("you", question), ("assistant", retried)]
        assert saved(app) == [("user", FLATTEN), ("assistant", first), ("user", question), ("assistant", retried)]
        assert app.engine.conversation.messages == app.session.conversation()
        # saved as a normal turn: its messages on screen have their ids; a second ctrl+r regenerates it
        assert app.chat.last_assistant().message_id == app.session.messages[-1].id
        await regenerate(pilot, app)
        assert [r for r, _ in shown(app)] == ["you", "assistant", "you", "assistant"]
        assert app.session.siblings(app.session.messages[-1].id) == (2, 2)
        assert app.session.messages[-2].content == question and app.session.messages[0].content == FLATTEN


async def test_a_failed_turn_is_not_retried_once_another_message_was_sent(qwen3_dirs):
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 4
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        args = app.engine.conversation.target.args
        context, args.max_position_embeddings = args.max_position_embeddings, 64
        await send(pilot, app, "word" + " word" * 80)
        await finish_turn(pilot, app)
        args.max_position_embeddings = context
        await send(pilot, app, FLATTEN)
        await finish_turn(pilot, app)
        await regenerate(pilot, app)  # regenerates the reply to the message sent since
        assert [(m.role, m.content) for m in app.session.messages][:1] == [("user", FLATTEN)]
        assert len(app.session.messages) == 2 and app.session.siblings(app.session.messages[-1].id) == (2, 2)


# -- a real server whose stream breaks off mid-reply --------------------------------------------------
class BreakingServer(ThreadServer):
    """An OpenAI-compatible chat server (Starlette on uvicorn, in a thread) that streams a reply a
    piece every few ms; the first time it is asked one of `breaks`, it stops mid-reply and closes the
    stream, as a server killed there does."""

    def __init__(self, breaks: tuple[str, ...] = (PARSE,), pieces: int = 24, broken_after: int = 12) -> None:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        self.asked: list[str] = []

        def chunk(content: str, finish: Any = None) -> str:
            body = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "breaking-model",
                    "choices": [{"index": 0, "delta": {"content": content} if content else {},
                                 "finish_reason": finish}]}
            return f"data: {json.dumps(body)}\n\n"

        async def models(request: Request) -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": "breaking-model", "object": "model"}]})

        async def chat(request: Request) -> StreamingResponse:
            question = json.loads(await request.body())["messages"][-1]["content"]
            breaking = question in breaks and question not in self.asked
            self.asked.append(question)
            word = f"{question.split()[0].lower()}{self.asked.count(question)} "

            async def stream() -> Any:
                for i in range(broken_after if breaking else pieces):
                    await asyncio.sleep(0.01)
                    yield chunk(word)
                if breaking:
                    return  # the stream ends here: no finish, no [DONE]
                yield chunk("", "stop")
                yield "data: [DONE]\n\n"

            return StreamingResponse(stream(), media_type="text/event-stream")

        super().__init__(Starlette(routes=[Route("/v1/models", models),
                                           Route("/v1/chat/completions", chat, methods=["POST"])]))


async def test_a_reply_broken_off_mid_way_keeps_the_meter_and_ctrl_r_answers_it(anyio_backend):
    from dflash_tui.remote.client import RemoteTarget
    from dflash_tui.ui.app import DFlashApp

    with BreakingServer() as server:
        app = DFlashApp(remote=RemoteTarget(server.url), probe_tokens=0)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.model_state in ("ready", "failed"), 30, "the connection")
            assert app.model_state == "ready"
            await send(pilot, app, FLATTEN)
            await finish_turn(pilot, app)
            first = app.chat.last_assistant().raw_text
            assert first == "flatten1 " * 24
            meter = meter_text(app)
            state = app.meter.state
            figures = (state.turn_tps, state.ttft_s, state.turns, state.kept_tps)
            assert "tok/s turn" in meter and "live" not in meter  # the narrow meter: "turn", not "last turn"

            await send(pilot, app, PARSE)
            await finish_turn(pilot, app)
            notes = [t for r, t in shown(app) if r == "note"]
            assert any("mid-reply" in t for t in notes), notes
            assert app.chat.last_assistant().query_one(".message-footer").render().plain == "failed"
            # the failed reply measured nothing: the meter reads as before it
            assert meter_text(app) == meter and not app.meter.state.generating
            assert (state.turn_tps, state.ttft_s, state.turns, state.kept_tps) == figures

            await regenerate(pilot, app)
            assert server.asked == [FLATTEN, PARSE, PARSE]  # the failed question, asked again
            retried = "parse2 " * 24
            assert shown(app) == [("you", FLATTEN), ("assistant", first), ("you", PARSE), ("assistant", retried)]
            assert saved(app) == [("user", FLATTEN), ("assistant", first), ("user", PARSE), ("assistant", retried)]
            assert app.engine.messages == [{"role": "user", "content": FLATTEN}, {"role": "assistant", "content": first},
                                           {"role": "user", "content": PARSE}, {"role": "assistant", "content": retried}]


async def test_a_failed_regenerate_keeps_the_reply_it_would_have_replaced(qwen3_dirs):
    """ctrl+r that fails: the reply in view (and in the file) stays on screen and in the engine's
    conversation, so the next message follows it (the engine had dropped it: two questions in a row)."""
    app = make_app(qwen3_dirs, probe_tokens=0)
    app.options.max_tokens = 6
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        question = PARSE + " 2024-01-02T03:04:05Z" * 4
        await send(pilot, app, question)
        await finish_turn(pilot, app)
        first = app.chat.last_assistant().raw_text
        args = app.engine.conversation.target.args
        context, args.max_position_embeddings = args.max_position_embeddings, 16  # now past the context
        await regenerate(pilot, app)
        await wait_for(pilot, lambda: any("not kept" in t for r, t in shown(app) if r == "note"), 10,
                       "the note that the new reply was not kept")
        assert [(r, t) for r, t in shown(app) if r != "note"] == [("you", question), ("assistant", first)]
        assert saved(app) == [("user", question), ("assistant", first)]
        await wait_for(pilot, lambda: app.engine.conversation.messages == app.session.conversation(), 10,
                       "the engine back on the branch")
        args.max_position_embeddings = context
        await send(pilot, app, FLATTEN)
        await finish_turn(pilot, app)
        roles = [m["role"] for m in app.engine.conversation.messages]
        assert roles == ["user", "assistant", "user", "assistant"], roles
        assert app.engine.conversation.messages == app.session.conversation()
