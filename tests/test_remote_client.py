"""The remote engine client against loopback servers: recorded vLLM and SGLang shapes, and hostile ones.

vLLM and SGLang cannot run here (no CUDA), so their streams are recorded examples built from their
documentation and source: vLLM's per-request `metrics.speculative_decoding`
(https://docs.vllm.ai/en/stable/features/speculative_decoding/acceptance_metrics/, with
`--per-request-spec-decode-metrics detailed`) and SGLang's `meta_info` spec fields
(python/sglang/srt/managers/tokenizer_manager.py in sgl-project/sglang), played by a real HTTP
server on 127.0.0.1 so the client's own network code runs.
"""

from __future__ import annotations

import time

import pytest

from dflash_tui.engine.events import Block, Done, Error, Prefill
from dflash_tui.remote import figures as fig
from dflash_tui.remote.client import RemoteClient, RemoteError, RemoteTarget, normalize_url, public_url
from remote_fakes import FakeServer, chunk, models, sse, stream_then

JSON = "application/json"
STREAM = "text/event-stream"

# vLLM, detailed level: the finishing chunk carries `metrics` (timing + speculative_decoding)
VLLM_SPEC = {"mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.5, "acceptance_histogram": [1, 0, 1, 0],
             "acceptance_histogram_by_draft_length": {"3": [1, 0, 1, 0]}, "num_spec_steps": 2,
             "num_accepted_draft_tokens": 2, "num_draft_tokens": 6, "num_spec_tokens": 3,
             "per_step_accepted": [2, 0], "per_step_drafted": [3, 3]}
VLLM_STREAM = sse(chunk(""), chunk("Hello"), chunk(" there"), chunk("!"),
                  chunk(None, "stop", metrics={"time_to_first_token_ms": 12.0, "speculative_decoding": VLLM_SPEC}),
                  {**chunk(None), "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}})
# SGLang: meta_info with its spec fields on the last chunk
SGLANG_META = {"prompt_tokens": 9, "completion_tokens": 7, "spec_verify_ct": 3, "spec_accept_length": 7 / 3,
               "spec_accept_rate": 4 / 9, "spec_num_correct_drafts": 4, "spec_num_proposed_drafts": 9}


@pytest.fixture
def fake():
    server = FakeServer().start()
    yield server
    server.stop()


def serve(fake: FakeServer, stream, model_ids=("m",), metrics=None) -> None:
    fake.routes[("GET", "/v1/models")] = (200, JSON, models(*model_ids))
    fake.routes[("POST", "/v1/chat/completions")] = stream if callable(stream) or isinstance(stream, tuple) \
        else (200, STREAM, stream)
    if metrics is not None:
        fake.routes[("GET", "/metrics")] = metrics


def run(fake: FakeServer, **kw) -> list:
    timeout = kw.pop("timeout", 3.0)
    client = RemoteClient(RemoteTarget(fake.url + "/v1/", **kw), read_timeout=timeout)
    try:
        client.connect()
        return list(client.chat([{"role": "user", "content": "hi"}], {"max_tokens": 16}))
    finally:
        client.close()


def test_vllm_per_step_counts_become_the_done_figures(fake):
    serve(fake, VLLM_STREAM)
    events = run(fake)
    assert isinstance(events[0], Prefill)
    blocks = [e for e in events if isinstance(e, Block)]
    assert [b.text for b in blocks] == ["Hello", " there", "!"] and all(not b.drafted and not b.emitted for b in blocks)
    done = events[-1]
    assert isinstance(done, Done) and done.text == "Hello there!" and done.finish_reason == "stop"
    s = done.stats
    assert s["spec_source"] == fig.VLLM and s["spec_steps"] == [[2, 3], [0, 3]]
    assert s["cycles"] == 2 and s["acceptance"] == pytest.approx(2 / 6) and s["tokens_per_cycle"] == 2.0
    assert s["generated_tokens"] == 4 and s["tokens_counted"] == "usage" and s["prompt_tokens"] == 9
    sent = fake.seen[-1][2]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True} and "dflash" not in sent


def test_vllm_summary_only_gives_totals_without_rows(fake):
    summary = {k: v for k, v in VLLM_SPEC.items() if not k.startswith("per_step")}
    serve(fake, sse(chunk("a"), chunk(None, "length", metrics={"speculative_decoding": summary})))
    s = run(fake)[-1].stats
    assert s["cycles"] == 2 and s["spec_accepted"] == 2 and "spec_steps" not in s


def test_sglang_meta_info_counts(fake):
    serve(fake, sse(chunk("x"), chunk("y", "stop", meta_info=SGLANG_META)))
    s = run(fake)[-1].stats
    assert s["spec_source"] == fig.SGLANG and s["cycles"] == 3 and s["spec_accepted"] == 4 and s["spec_drafted"] == 9
    assert s["tokens_per_cycle"] == pytest.approx(1 + 4 / 3)


def test_sglang_with_only_the_mean_length():
    f = fig.from_sglang({"spec_verify_ct": 4, "spec_accept_length": 2.5, "completion_tokens": 10})
    assert f is not None and f.accepted == 6 and f.drafted is None


@pytest.mark.parametrize("bad", [
    {"speculative_decoding": {"num_spec_steps": "2", "num_accepted_draft_tokens": 1}},
    {"speculative_decoding": {"num_spec_steps": 2, "num_accepted_draft_tokens": 9, "num_draft_tokens": 3}},
    {"speculative_decoding": []}, "nonsense", None,
])
def test_malformed_vllm_figures_are_ignored(bad):
    assert fig.from_vllm(bad) is None


def test_metrics_counters_before_and_after_when_no_per_request_figures(fake):
    pages = iter([b"vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 30\n"
                  b"vllm:spec_decode_num_accepted_tokens_total 12\n"] * 2 +
                 [b'vllm:spec_decode_num_drafts_total{model_name="m"} 14\nvllm:spec_decode_num_draft_tokens_total 42\n'
                  b"vllm:spec_decode_num_accepted_tokens_total 20\n# HELP x\n"])
    serve(fake, sse(chunk("ok"), chunk(None, "stop")),
          metrics=lambda req: req._send(200, "text/plain", next(pages)))
    s = run(fake)[-1].stats
    assert s["spec_source"] == fig.METRICS and s["cycles"] == 4 and s["spec_drafted"] == 12 and s["spec_accepted"] == 8


def test_a_plain_server_reports_none(fake):
    serve(fake, sse(chunk("just text"), chunk(None, "stop")))
    s = run(fake)[-1].stats
    assert s["spec_source"] == "none" and s["mode"] == "remote" and s["tokens_counted"] == "chunks"


# -- hostile servers: one clear line, never an exception ----------------------------------------------
def test_garbage_in_the_stream(fake):
    serve(fake, sse(chunk("a"), b"{not json"))
    last = run(fake)[-1]
    assert isinstance(last, Error) and "not JSON" in last.message


def test_a_stream_cut_mid_reply(fake):
    serve(fake, stream_then(sse(chunk("half a rep"), done=False)))
    last = run(fake)[-1]
    assert isinstance(last, Error) and "mid-reply" in last.message


def test_a_server_that_goes_silent_times_out(fake):
    serve(fake, stream_then(sse(chunk("a"), done=False)[:-1], hang=fake.release))
    last = run(fake, timeout=1.0)[-1]
    assert isinstance(last, Error) and "sent nothing for" in last.message


def test_an_error_status_and_an_error_chunk(fake):
    serve(fake, (400, JSON, b'{"error": {"message": "max_tokens is too large\\nsecond line"}}'))
    last = run(fake)[-1]
    assert isinstance(last, Error) and last.message.endswith("(400): max_tokens is too large")
    serve(fake, sse(chunk("a"), {"error": {"message": "out of memory", "type": "server_error"}}))
    assert run(fake)[-1].message == "the server: out of memory"
    serve(fake, (501, "text/html", b"<!DOCTYPE HTML>\n<html><p>Unsupported method ('POST')</p></html>"))
    assert run(fake)[-1].message == ("the server refused the request (501): a web page, not an API's error: "
                                     "is this an OpenAI-compatible server's address?")


def test_escapes_in_text_are_data(fake):
    serve(fake, sse(chunk("\x1b[2J\x1b]52;c;aGk=\x07 hi"), chunk(None, "stop")))
    assert run(fake)[-1].text == "\x1b[2J\x1b]52;c;aGk=\x07 hi"  # kept as sent; the chat shows it made visible


def test_connect_errors_are_one_line(fake):
    fake.routes[("GET", "/v1/models")] = (401, JSON, b'{"error": {"message": "bad key"}}')
    with pytest.raises(RemoteError, match="wants an API key"):
        RemoteClient(RemoteTarget(fake.url)).connect()
    fake.routes[("GET", "/v1/models")] = (200, "text/html", b"<html>hello</html>")
    with pytest.raises(RemoteError, match="not an OpenAI-compatible server"):
        RemoteClient(RemoteTarget(fake.url)).connect()
    page = b"<!DOCTYPE HTML>\n<html><title>Error response</title></html>"  # python -m http.server's 404 and 501
    fake.routes[("GET", "/v1/models")] = (404, "text/html", page)
    with pytest.raises(RemoteError, match=r"not an OpenAI-compatible server \(nothing at /v1/models: 404\)"):
        RemoteClient(RemoteTarget(fake.url)).connect()
    fake.routes[("GET", "/v1/models")] = (500, "text/html", page)
    with pytest.raises(RemoteError, match="answered 500: a web page, not an API's error") as e:
        RemoteClient(RemoteTarget(fake.url)).connect()
    assert "DOCTYPE" not in str(e.value)
    fake.routes[("GET", "/v1/models")] = (200, JSON, models("a", "b"))
    with pytest.raises(RemoteError, match="does not serve 'c'"):
        RemoteClient(RemoteTarget(fake.url, model="c")).connect()
    fake.stop()
    with pytest.raises(RemoteError, match="nothing answers"):
        RemoteClient(RemoteTarget(fake.url)).connect()


def test_urls():
    assert normalize_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert public_url("https://user:secret@h.example:9/x?key=abc") == "https://h.example:9/x"
    with pytest.raises(ValueError):
        normalize_url("ftp://x")


def test_silence_mid_reply_ends_the_turn_after_the_stall_limit_not_the_first_token_wait():
    """A real server (Starlette on uvicorn) that sends one piece and goes silent: the turn ends with
    one line after the mid-reply limit, although the wait for the first token is much longer."""
    import time

    from stall_server import StallServer

    with StallServer() as server:
        client = RemoteClient(RemoteTarget(server.url), read_timeout=60.0, stall_timeout=1.0)
        try:
            client.connect()
            started = time.monotonic()
            events = list(client.chat([{"role": "user", "content": "hi"}], {"max_tokens": 16}))
            took = time.monotonic() - started
        finally:
            client.close()
        assert [e.text for e in events if isinstance(e, Block)] == ["Hello"]
        last = events[-1]
        assert isinstance(last, Error) and last.message == "the server sent nothing for 1 s mid-reply; the turn was given up"
        assert took < 30, took  # the 60 s first-token wait did not apply once the reply streamed
        assert server.hung_up.wait(10), "the client did not hang up on the silent server"


def test_abort_from_another_thread_ends_a_silent_turn_at_once():
    import threading

    from stall_server import StallServer

    with StallServer() as server:
        client = RemoteClient(RemoteTarget(server.url))  # the default waits: 120 s, 30 s mid-reply
        stop = threading.Event()
        try:
            client.connect()
            events = []
            for ev in client.chat([{"role": "user", "content": "hi"}], {"max_tokens": 16}, stop.is_set):
                events.append(ev)
                if isinstance(ev, Block):  # the reply streams, then the server goes silent: stop from elsewhere
                    threading.Timer(0.3, lambda: (stop.set(), client.abort())).start()
        finally:
            client.close()
        last = events[-1]
        assert isinstance(last, Done) and last.finish_reason == "cancelled" and last.text == "Hello"
        assert server.hung_up.wait(10), "the server did not see the client go"


def test_the_drafts_own_block_size_limits_block_where_a_server_reports_it(fake):
    """A dflash-tui serve entry (shape of docs/server.md) with the draft's trained size beside the server's
    own: /block's limit is the draft's (EngineReady's block_size); a request that names none runs the server's."""
    import json

    def entry(**dflash):
        return json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "dflash": dflash}]}).encode()

    fake.routes[("GET", "/v1/models")] = (200, JSON, entry(draft=True, num_spec_tokens=3, draft_block_size=16,
                                                           block_size=4))
    client = RemoteClient(RemoteTarget(fake.url))
    info = client.connect()
    assert info.kind == "dflash" and info.block_size == 16 and info.default_block == 4
    ask = [{"role": "user", "content": "hi"}]
    assert "block_size" not in client.request_body(ask, {"block_size": None})["dflash"]  # the server's own
    assert client.request_body(ask, {"block_size": 0})["dflash"]["block_size"] == 0  # the draft's own
    assert client.request_body(ask, {"block_size": "auto"})["dflash"]["block_size"] == "auto"
    # a server that reports only num_spec_tokens: its own block size is all the client knows
    fake.routes[("GET", "/v1/models")] = (200, JSON, entry(draft=True, num_spec_tokens=3))
    info = client.connect()
    assert info.block_size == 4 and info.default_block == 4
    client.close()


def test_a_restarted_dflash_server_s_figures_are_read_again(fake):
    """dflash-tui serve measures its probe after each start: the client reads the figures again before a
    turn (a changed pair's are dropped: they would compare other things)."""
    import json

    def entry(model="m", draft_block=16, probe=(40.0, 30.0)):
        ext = {"draft": True, "num_spec_tokens": 15, "draft_block_size": draft_block, "block_size": None,
               "probe": {"target_alone_tps": probe[0], "dflash_tps": probe[1]}}
        return json.dumps({"object": "list", "data": [{"id": model, "object": "model", "dflash": ext}]}).encode()

    fake.routes[("GET", "/v1/models")] = (200, JSON, entry())
    client = RemoteClient(RemoteTarget(fake.url))
    info = client.connect()
    assert client.refresh_figures() is False and (info.target_alone_tps, info.dflash_probe_tps) == (40.0, 30.0)
    fake.routes[("GET", "/v1/models")] = (200, JSON, entry(probe=(52.5, 31.0)))  # restarted: measured anew
    assert client.refresh_figures() is True
    assert client.info is info and (info.target_alone_tps, info.dflash_probe_tps) == (52.5, 31.0)
    fake.routes[("GET", "/v1/models")] = (200, JSON, entry(draft_block=8))  # another draft now
    assert client.refresh_figures() is True and (info.target_alone_tps, info.dflash_probe_tps) == (None, None)
    assert info.block_size == 16  # the rest stays what the app was told at connect
    fake.routes[("GET", "/v1/models")] = (200, JSON, entry(model="other"))
    assert client.refresh_figures() is False and info.model == "m"
    fake.routes[("GET", "/v1/models")] = lambda req: fake.release.wait(30)  # hung: not the turn's wait
    tic = time.monotonic()
    assert client.refresh_figures() is False and info.model == "m"
    assert time.monotonic() - tic < 5
    fake.release.set()
    fake.stop()  # down: nothing changes here, the turn says it
    assert client.refresh_figures() is False and info.model == "m"
    client.close()
