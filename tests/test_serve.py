"""`dflash-tui serve` for real: a server process on localhost, driven by the official openai client."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
import time
from urllib.parse import urlparse

import pytest

openai = pytest.importorskip("openai")

from dflash_tui.engine.events import Block, Done, Prefill, event_from_dict  # noqa: E402
from dflash_tui.server.launch import ServerProcess  # noqa: E402

KEY = "test-key-123"
PROMPT = "Write a function that reverses a list"
LONG = 20000  # more than the tiny target ever writes before its EOS: a request that runs for seconds


@pytest.fixture(scope="module")
def server(qwen3_dirs):
    args = ["--model", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["draft"]), "--api-key", KEY,
            "--max-queue", "2", "--max-tokens-limit", str(LONG), "--max-request-bytes", "65536", "--log-level", "warning"]
    with ServerProcess(args, env={"HF_HUB_OFFLINE": "1"}) as s:
        yield s
        assert s.stop() == 0  # Ctrl-C: a clean stop
        log = s.log()
    assert "Traceback" not in log and "stopped" in log, log


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def raw(server, method: str, path: str, body=None, headers=None) -> tuple[int, dict, str]:
    """One plain HTTP request: (status, headers, body text)."""
    url = urlparse(server.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Authorization": f"Bearer {KEY}", **(headers or {})})
    r = conn.getresponse()
    text = r.read().decode("utf-8", "replace")
    conn.close()
    return r.status, dict(r.getheaders()), text


def metric(server, name: str, labels: str = "") -> float:
    _, _, text = raw(server, "GET", "/metrics")
    pattern = rf"^dflash:{re.escape(name)}\{{[^}}]*{re.escape(labels)}[^}}]*\}} (\S+)$"
    found = re.findall(pattern, text, re.M)
    return sum(float(v) for v in found)


def cli_generate(dirs, *extra: str) -> Done:
    """`dflash-tui generate --json` on the same pair: its Done event."""
    out = subprocess.run([sys.executable, "-m", "dflash_tui", "generate", PROMPT, "--model", str(dirs["target"]),
                          "--draft", str(dirs["draft"]), "--json", *extra],
                         capture_output=True, text=True, timeout=120, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    last = json.loads(out.stdout.strip().splitlines()[-1])
    for k in ("tokens_per_cycle", "acceptance", "tok_per_s"):
        last.pop(k, None)
    return event_from_dict(last)


def idle(server) -> bool:
    """Nothing running or waiting (a request cut by a stop string finishes its cycle after the reply)."""
    health = json.loads(raw(server, "GET", "/health")[2])
    return health["running"] == 0 and health["waiting"] == 0


def wait_for(predicate, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


# -- endpoints ---------------------------------------------------------------
def test_health_models_and_api_key(server, client):
    status, _, body = raw(server, "GET", "/health", headers={"Authorization": ""})
    assert status == 200 and json.loads(body)["status"] == "ok"
    listed = client.models.list().data
    assert [m.id for m in listed] == ["target"]  # the directory's name, never its path
    probe = listed[0].model_extra["dflash"]["probe"]  # measured after load, as the TUI's local probe
    assert probe["target_alone_tps"] > 0 and probe["dflash_tps"] > 0
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    status, _, _ = raw(server, "GET", "/metrics", headers={"Authorization": "Bearer wrong"})
    assert status == 401


def test_greedy_equals_generate_plain_streamed_and_block_events(qwen3_dirs, server, client):
    ref = cli_generate(qwen3_dirs, "--max-tokens", "40")
    messages = [{"role": "user", "content": PROMPT}]
    plain = client.chat.completions.create(model="target", messages=messages, max_tokens=40)
    assert plain.choices[0].message.content == ref.text
    assert plain.choices[0].finish_reason == ref.finish_reason == "length"
    assert plain.usage.completion_tokens == len(ref.tokens) == 40
    spec = plain.model_extra["metrics"]["speculative_decoding"]
    assert spec["num_spec_tokens"] == 15 and spec["num_spec_steps"] == ref.stats["cycles"]
    assert sum(spec["acceptance_histogram"]) == spec["num_spec_steps"]
    by_length = spec["acceptance_histogram_by_draft_length"]  # near max_tokens the engine drafts fewer
    assert spec["num_draft_tokens"] == sum(int(k) * sum(v) for k, v in by_length.items())
    assert spec["num_accepted_draft_tokens"] / spec["num_draft_tokens"] == pytest.approx(ref.stats["acceptance"])
    assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["num_accepted_draft_tokens"] / spec["num_spec_steps"])

    # streamed, with the block extension: the same text, and the engine's own events rebuilt exactly
    chunks = list(client.chat.completions.create(
        model="target", messages=messages, max_tokens=40, stream=True, stream_options={"include_usage": True},
        extra_body={"dflash": {"blocks": True, "detailed": True}}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text
    events = [event_from_dict(c.model_extra["dflash"]["event"]) for c in chunks if (c.model_extra or {}).get("dflash")]
    assert isinstance(events[0], Prefill) and isinstance(events[-1], Done)
    blocks = [e for e in events if isinstance(e, Block)]
    assert [t for b in blocks for t in b.emitted[: b.reply_tokens]] == ref.tokens == events[-1].tokens
    assert "".join(b.text for b in blocks) == ref.text[: len("".join(b.text for b in blocks))]
    with_texts = [c.model_extra["dflash"] for c in chunks if (c.model_extra or {}).get("dflash", {}).get("drafted_text") is not None]
    assert all(len(d["drafted_text"]) == len(d["event"]["drafted"]) for d in with_texts)
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
    detailed = finish[0].model_extra["metrics"]["speculative_decoding"]
    assert detailed["per_step_drafted"] == [len(b.drafted) for b in blocks if b.drafted]
    assert detailed["per_step_accepted"] == [b.accepted for b in blocks if b.drafted]
    assert chunks[-1].usage.completion_tokens == 40 and chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens

    # streamed without the extension: plain OpenAI chunks, same text
    plain_stream = client.chat.completions.create(model="target", messages=messages, max_tokens=40, stream=True)
    chunks = list(plain_stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    assert not any((c.model_extra or {}).get("dflash") for c in chunks)


def test_seeded_sampling_equals_generate(qwen3_dirs, client):
    ref = cli_generate(qwen3_dirs, "--max-tokens", "30", "--temperature", "0.9", "--top-k", "50", "--seed", "1234")
    ask = dict(model="target", messages=[{"role": "user", "content": PROMPT}], max_tokens=30, temperature=0.9,
               seed=1234, extra_body={"top_k": 50})
    first = client.chat.completions.create(**ask)
    assert first.choices[0].message.content == ref.text
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**ask, stream=True))
    assert streamed == ref.text
    other = client.chat.completions.create(**{**ask, "seed": 99})
    assert other.choices[0].message.content != ref.text
    # -1 is no seed (as --seed -1): each reply draws its own, where a fixed -1 would repeat one
    unseeded = {client.chat.completions.create(**{**ask, "seed": -1}).choices[0].message.content for _ in range(2)}
    assert len(unseeded) == 2


def test_stop_strings(qwen3_dirs, client):
    messages = [{"role": "user", "content": PROMPT}]
    full = client.chat.completions.create(messages=messages, model="target", max_tokens=40).choices[0].message.content
    stop = full[12:15]
    expected = full[: full.find(stop)]
    cut = client.chat.completions.create(messages=messages, model="target", max_tokens=40, stop=[stop, "\u0000never"])
    assert cut.choices[0].message.content == expected and cut.choices[0].finish_reason == "stop"
    streamed = list(client.chat.completions.create(messages=messages, model="target", max_tokens=40, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def _block_stream(client, dflash=None, **kw):
    chunks = list(client.chat.completions.create(
        model="target", messages=[{"role": "user", "content": PROMPT}], max_tokens=40, stream=True,
        stream_options={"include_usage": True},
        extra_body={"dflash": {"blocks": True, "detailed": True, **(dflash or {})}}, **kw))
    ext = [c.model_extra["dflash"] for c in chunks if (c.model_extra or {}).get("dflash")]
    return chunks, [event_from_dict(d["event"]) for d in ext], ext


def test_a_stop_string_cut_ends_the_block_stream_with_a_trimmed_block_and_done(server, client):
    _, full_events, full_ext = _block_stream(client)
    full = full_events[-1]
    token_text = {}
    for d in full_ext:
        token_text.update(zip(d["event"].get("emitted", []), d.get("emitted_text") or []))
    stop = full.text[12:15]
    expected = full.text[: full.text.find(stop)]
    assert wait_for(lambda: idle(server))

    chunks, events, _ = _block_stream(client, stop=[stop])
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    done = events[-1]
    assert isinstance(done, Done), events[-3:]  # the block stream ends as an uncut one does
    assert done.finish_reason == "stop" and done.text == expected
    blocks = [e for e in events if isinstance(e, Block)]
    assert "".join(b.text for b in blocks) == expected  # the cut block's text ends at the cut
    sent = [t for b in blocks for t in b.emitted[: b.reply_tokens]]
    assert done.tokens == sent and sent == full.tokens[: len(sent)]
    # the kept tokens are exactly those that give the kept text a character
    covered = "".join(token_text[t] for t in sent)
    assert len(covered) >= len(expected) and len("".join(token_text[t] for t in sent[:-1])) < len(expected)
    assert len(sent) < len(full.tokens)
    last = blocks[-1]
    assert last.accepted <= len(last.emitted) and not last.eos
    assert done.stats["generated_tokens"] == len(sent) and done.stats["cycles"] == sum(1 for b in blocks if b.drafted)
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "stop"
    spec = finish[0].model_extra["metrics"]["speculative_decoding"]
    assert spec["per_step_accepted"] == [b.accepted for b in blocks if b.drafted]
    assert chunks[-1].usage.completion_tokens == len(sent)


def _spec(chunks) -> dict:
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    return finish[0].model_extra["metrics"]["speculative_decoding"]


def test_baseline_and_block_size_per_request(server, client):
    chunks, events, _ = _block_stream(client)
    normal = events[-1]
    assert any(len(e.drafted) > 3 for e in events if isinstance(e, Block))  # the draft's own block: 16

    # baseline: the target alone, nothing drafted, the same greedy text; the figures say zero drafts
    chunks, events, _ = _block_stream(client, {"baseline": True})
    done = events[-1]
    blocks = [e for e in events if isinstance(e, Block)]
    assert done.text == normal.text and done.tokens == normal.tokens and done.stats["mode"] == "baseline"
    assert blocks and all(b.drafted == [] for b in blocks)
    spec = _spec(chunks)
    assert spec["num_spec_steps"] == spec["num_draft_tokens"] == spec["num_accepted_draft_tokens"] == 0
    assert spec["acceptance_histogram"] == [0] * 16 and spec["num_spec_tokens"] == 15
    plain = client.chat.completions.create(model="target", messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=40, extra_body={"dflash": {"baseline": True}})
    assert plain.choices[0].message.content == normal.text
    assert plain.model_extra["metrics"]["speculative_decoding"]["num_draft_tokens"] == 0

    # block_size 4: at most 3 drafted a cycle, the same text
    chunks, events, _ = _block_stream(client, {"block_size": 4})
    blocks = [e for e in events if isinstance(e, Block)]
    assert events[-1].text == normal.text and events[-1].stats["block_size"] == 4
    assert any(b.drafted for b in blocks) and all(len(b.drafted) <= 3 for b in blocks)
    assert max(_spec(chunks)["per_step_drafted"]) <= 3
    _, events, _ = _block_stream(client, {"block_size": "auto"})
    assert events[-1].text == normal.text and events[-1].stats["block_size"] == "auto"
    # for that request only: the next one drafts the server's default again
    _, events, _ = _block_stream(client)
    assert any(len(e.drafted) > 3 for e in events if isinstance(e, Block))

    # 0: the draft's own block, as --block-size 0 and /block 0
    _, events, _ = _block_stream(client, {"block_size": 0})
    assert events[-1].text == normal.text and events[-1].stats["block_size"] == 16
    assert any(len(e.drafted) > 3 for e in events if isinstance(e, Block))


def test_block_size_1_and_past_the_draft_are_refused_in_the_clis_words(client):
    from dflash_tui.engine.block_limit import refusal

    def refused(block) -> str:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="target", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                           extra_body={"dflash": {"block_size": block}})
        assert caught.value.status_code == 400
        return caught.value.body["message"]

    # `serve --block-size 1` says it before loading anything: the request is told the same, field for flag
    cli = subprocess.run([sys.executable, "-m", "dflash_tui", "serve", "--demo", "--block-size", "1"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and "--block-size 1: " in cli.stderr, cli.stderr
    words = cli.stderr.strip().split("--block-size 1: ", 1)[1]
    assert "1 drafts nothing" in words and '"baseline": true' in words  # how a request runs the target alone
    assert refused(1) == f"'dflash.block_size' 1: {words}"
    assert refused(17) == f"'dflash.block_size': {refusal(17, 16)}"  # /block 17's and serve --block-size 17's words
    assert refused(-1).startswith("'dflash.block_size' -1: a block size is auto, 0 (the draft's own) or a number")
    assert refused("4").startswith("'dflash.block_size' must be a number or \"auto\"")


def test_a_server_without_a_draft_takes_baseline_and_refuses_a_block_size(qwen3_dirs, client):
    messages = [{"role": "user", "content": PROMPT}]
    ref = client.chat.completions.create(model="target", messages=messages, max_tokens=20).choices[0].message.content
    args = ["--model", str(qwen3_dirs["target"]), "--log-level", "warning"]
    with ServerProcess(args, env={"HF_HUB_OFFLINE": "1"}) as s:
        alone = openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0, timeout=60)
        for ext in ({"baseline": True}, {"block_size": "auto"}, {"block_size": 0}):
            r = alone.chat.completions.create(model="target", messages=messages, max_tokens=20, extra_body={"dflash": ext})
            assert r.choices[0].message.content == ref, ext
            assert r.model_extra["metrics"]["speculative_decoding"]["num_draft_tokens"] == 0
        with pytest.raises(openai.BadRequestError, match="this server has no draft"):
            alone.chat.completions.create(model="target", messages=messages, max_tokens=2,
                                          extra_body={"dflash": {"block_size": 4}})
        with pytest.raises(openai.BadRequestError, match="1 drafts nothing"):
            alone.chat.completions.create(model="target", messages=messages, max_tokens=2,
                                          extra_body={"dflash": {"block_size": 1}})
        assert s.stop() == 0


def test_cache_reuse_and_metrics(server, client):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "one two three"}]
    assert wait_for(lambda: idle(server))
    before = {n: metric(server, n) for n in ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                                             "spec_decode_num_accepted_tokens_total", "generation_tokens_total")}
    a = client.chat.completions.create(model="target", messages=messages, max_tokens=8)
    b = client.chat.completions.create(model="target", messages=messages, max_tokens=8)
    assert b.usage.prompt_tokens_details.cached_tokens == b.usage.prompt_tokens - 1  # all but the one token to prefill
    messages[-1]["content"] = "four five"
    c = client.chat.completions.create(model="target", messages=messages, max_tokens=8)
    assert 0 < c.usage.prompt_tokens_details.cached_tokens < c.usage.prompt_tokens  # the shared system part
    spec = [r.model_extra["metrics"]["speculative_decoding"] for r in (a, b, c)]
    pairs = {"spec_decode_num_drafts_total": "num_spec_steps", "spec_decode_num_draft_tokens_total": "num_draft_tokens",
             "spec_decode_num_accepted_tokens_total": "num_accepted_draft_tokens"}
    for counter, field in pairs.items():  # the server's counters move by what the responses reported
        assert metric(server, counter) - before[counter] == sum(s[field] for s in spec), counter
    assert metric(server, "generation_tokens_total") - before["generation_tokens_total"] == 24
    _, headers, text = raw(server, "GET", "/metrics")
    assert headers["content-type"].startswith("text/plain")
    for name in ("time_to_first_token_seconds_count", "request_decode_tokens_per_second_count", "num_requests_waiting",
                 'spec_decode_num_accepted_tokens_per_pos_total{model_name="target",position="14"}'):
        assert "dflash:" + name in text


# -- hostile input -------------------------------------------------------------
BAD_BODIES = [
    (b"{not json", 400, "not valid JSON"),
    (b"[" * 20000 + b"]" * 20000, 400, "not valid JSON"),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, "not valid Unicode"),
    (b"\xff\xfe garbage", 400, "not valid JSON"),
    (b"", 400, "empty"),
    (json.dumps([1, 2]).encode(), 400, "JSON object"),
    (json.dumps({"messages": []}).encode(), 400, "non-empty list"),
    (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), 400, "content must be"),
    (json.dumps({"messages": [{"role": "tool", "content": "x"}]}).encode(), 400, "role must be"),
    (json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode(), 400, "text content"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}).encode(), 400, "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**30}).encode(), 400, "at most"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}).encode(), 400, "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400, "temperature"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": 7}).encode(), 400, "temperature"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "top_p": 0}).encode(), 400, "top_p"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "seed": "1"}).encode(), 400, "seed"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "seed": 2**64}).encode(), 400,
     "'seed' must be an integer from 0 to 2^64 - 1 (or -1: none)"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "seed": -2}).encode(), 400, "from 0 to 2^64 - 1"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "stop": ["a"] * 9}).encode(), 400, "stop"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 3}).encode(), 400, "'n'"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}).encode(), 400, "tools"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "dflash": {"blocks": True}}).encode(), 400, "stream"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "dflash": {"load": "/etc/passwd"}}).encode(), 400, "dflash"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "dflash": {"bsize": 4}}).encode(), 400,
     "'baseline' (booleans) and 'block_size'"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "dflash": {"block_size": 1}}).encode(), 400,
     "'dflash.block_size' 1: a block size is auto, 0 (the draft's own) or a number from 2"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "dflash": {"block_size": "big"}}).encode(), 400,
     "'dflash.block_size' must be"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "dflash": {"block_size": 4.0}}).encode(), 400,
     "'dflash.block_size' must be"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "dflash": {"block_size": 10**30}}).encode(), 400,
     "a block size is auto, 0 (the draft's own) or a number from 2 up to the draft's own"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "dflash": {"block_size": 17}}).encode(), 400,
     "block size 17 refused: the draft was trained to draft blocks of 16"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "dflash": {"baseline": "yes"}}).encode(), 400,
     "'dflash.baseline' must be true or false"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "model": "/etc/passwd"}).encode(), 404, "does not load"),
    (b'{"messages": "' + b"x" * 70000 + b'"}', 413, "larger than"),
]


@pytest.mark.parametrize("body,status,words", BAD_BODIES, ids=range(len(BAD_BODIES)))
def test_bad_requests_get_one_clear_error(server, body, status, words):
    got, headers, text = raw(server, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    assert got == status, text
    message = json.loads(text)["error"]["message"]
    assert words in message and "Traceback" not in text and "\n" not in message


def test_client_errors_through_openai(client):
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model="target", messages=[{"role": "user", "content": "x"}], max_tokens=0)
    with pytest.raises(openai.NotFoundError, match="does not load other models"):
        client.chat.completions.create(model="some/other-model", messages=[{"role": "user", "content": "x"}])
    # escape sequences are text like any other
    ok = client.chat.completions.create(model="target", messages=[{"role": "user", "content": "\x1b[2J\x1b]0;x\x07\u009b"}], max_tokens=3)
    assert ok.usage.completion_tokens == 3


# -- disconnects and the queue ---------------------------------------------------
def _open_stream(client, content: str):
    return client.chat.completions.create(model="target", messages=[{"role": "user", "content": content}],
                                          max_tokens=LONG, stream=True)


def _first_text(stream) -> None:
    for c in stream:
        if c.choices and c.choices[0].delta.content:
            return


def test_disconnect_cancels_generation(server, client):
    cancelled = metric(server, "request_success_total", 'finished_reason="cancelled"')
    tokens = metric(server, "generation_tokens_total")
    stream = _open_stream(client, "hello")
    _first_text(stream)
    stream.close()
    assert wait_for(lambda: metric(server, "request_success_total", 'finished_reason="cancelled"') == cancelled + 1)
    assert metric(server, "generation_tokens_total") - tokens < 200  # the tiny target writes 400+ tokens to this prompt
    assert idle(server)


def test_disconnect_cancels_a_plain_request_too(server):
    cancelled = metric(server, "request_success_total", 'finished_reason="cancelled"')
    url = urlparse(server.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    body = json.dumps({"messages": [{"role": "user", "content": "hello"}], "max_tokens": LONG})
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Authorization": f"Bearer {KEY}"})
    assert wait_for(lambda: json.loads(raw(server, "GET", "/health")[2])["running"] == 1)
    conn.close()  # hang up without reading the answer
    assert wait_for(lambda: metric(server, "request_success_total", 'finished_reason="cancelled"') == cancelled + 1, 5)
    assert idle(server)


def test_queue_limit_is_429_with_a_message(server, client):
    running = _open_stream(client, "hello")
    _first_text(running)
    waiting = [_open_stream(client, "hello again"), _open_stream(client, "and again")]
    assert wait_for(lambda: json.loads(raw(server, "GET", "/health")[2])["waiting"] == 2)
    with pytest.raises(openai.RateLimitError, match="2 requests are already waiting"):
        client.chat.completions.create(model="target", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert metric(server, "requests_rejected_total", 'reason="queue_full"') == 1
    for s in (*waiting, running):
        s.close()
    assert wait_for(lambda: idle(server))
    # and the server still serves
    after = client.chat.completions.create(model="target", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert after.usage.completion_tokens == 2


# -- safe defaults ---------------------------------------------------------------
def test_other_host_needs_an_api_key(qwen3_dirs):
    out = subprocess.run([sys.executable, "-m", "dflash_tui", "serve", "--model", str(qwen3_dirs["target"]), "--host", "0.0.0.0"],
                         capture_output=True, text=True, timeout=60, env={**__import__("os").environ, "DFLASH_TUI_API_KEY": ""})
    assert out.returncode == 1
    assert "--api-key" in out.stderr and "--insecure" in out.stderr and "Traceback" not in out.stderr
