"""The server's pure parts: stop-string matching, vLLM-shaped figures, request checks, the safety gate."""

from __future__ import annotations

import argparse

import pytest

from dflash_tui.engine.events import Block
from dflash_tui.errors import UserError
from dflash_tui.server.openai_format import Limits, RequestError, parse_chat_request
from dflash_tui.server.reply import StopMatcher
from dflash_tui.server.spec_tally import SpecTally


def test_stop_matcher_holds_back_only_a_possible_stop():
    m = StopMatcher(["END", "xyz"])
    assert m.feed("abcE") == ("abc", False)  # "E" may start "END"
    assert m.feed("Nd") == ("ENd", False)
    assert m.feed("fooEN") == ("foo", False)
    assert m.feed("D and more") == ("", True)
    m = StopMatcher(["ab"])
    assert m.feed("xa") == ("x", False)
    assert m.flush() == "a"
    assert StopMatcher([]).feed("any") == ("any", False)


def test_spec_tally_in_vllm_shape():
    t = SpecTally(num_spec_tokens=3)
    t.observe(Block(index=0, drafted=[], accepted=0, emitted=[1], text="a"))  # the first token: not a step
    t.observe(Block(index=1, drafted=[5, 6, 7], accepted=2, emitted=[5, 6, 9], text="b"))
    t.observe(Block(index=2, drafted=[5, 6, 7], accepted=0, emitted=[8], text="c"))
    t.observe(Block(index=3, drafted=[5], accepted=1, emitted=[5, 2], text="d"))  # a short block near max_tokens
    v = t.to_vllm(detailed=True)
    assert v["num_spec_steps"] == 3 and v["num_draft_tokens"] == 7 and v["num_accepted_draft_tokens"] == 3
    assert v["mean_acceptance_length"] == pytest.approx(2.0) and v["draft_acceptance_rate"] == pytest.approx(3 / 7)
    assert v["acceptance_histogram"] == [1, 1, 1, 0]
    assert v["acceptance_histogram_by_draft_length"] == {"1": [0, 1], "3": [1, 0, 1, 0]}
    assert v["per_step_accepted"] == [2, 0, 1] and v["per_step_drafted"] == [3, 3, 1]
    assert t.accepted_per_position() == [2, 1, 0]
    assert "per_step_accepted" not in t.to_vllm()
    assert SpecTally(15).to_vllm()["mean_acceptance_length"] == 1.0


LIMITS = Limits(model_ids=("m",), max_tokens_limit=100)


def test_a_good_request_is_parsed_whole():
    r = parse_chat_request({"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                                                       {"role": "user", "content": "hi"}],
                            "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": -1, "min_p": 0.1,
                            "seed": 3, "stop": "\n\n", "stream": True, "stream_options": {"include_usage": True},
                            "dflash": {"blocks": True}, "presence_penalty": 0, "unknown_field": 1}, LIMITS)
    assert r.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert (r.max_tokens, r.temperature, r.top_p, r.top_k, r.min_p, r.seed) == (7, 0.5, 0.9, 0, 0.1, 3)
    assert r.stop == ["\n\n"] and r.stream and r.include_usage and r.blocks
    assert parse_chat_request({"messages": [{"role": "user", "content": "x"}]}, LIMITS).max_tokens == 100


@pytest.mark.parametrize("extra", [{"temperature": True}, {"max_tokens": 1.5}, {"max_tokens": 5, "max_completion_tokens": 6},
                                   {"stream": "yes"}, {"stream_options": []}, {"presence_penalty": 0.5},
                                   {"response_format": {"type": "json_object"}}, {"logprobs": True}, {"stop": [""]}])
def test_bad_fields_are_request_errors(extra):
    with pytest.raises(RequestError):
        parse_chat_request({"messages": [{"role": "user", "content": "x"}], **extra}, LIMITS)


def test_binding_beyond_loopback_needs_a_key(monkeypatch, capsys):
    from dflash_tui.commands.serve import check_args, is_loopback

    monkeypatch.delenv("DFLASH_TUI_API_KEY", raising=False)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.3.2.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2") and not is_loopback("example.org")

    def args(**kw):
        base = dict(api_key=None, host="127.0.0.1", insecure=False, port=8080, max_tokens_limit=1, max_queue=1, max_request_bytes=1)
        return argparse.Namespace(**{**base, **kw})

    assert check_args(args()) is None
    with pytest.raises(UserError, match="--api-key"):
        check_args(args(host="0.0.0.0"))
    assert check_args(args(host="0.0.0.0", api_key="k")) == "k"
    assert check_args(args(host="0.0.0.0", insecure=True)) is None
    assert "WARNING" in capsys.readouterr().err
    monkeypatch.setenv("DFLASH_TUI_API_KEY", "from-env")
    assert check_args(args(host="0.0.0.0")) == "from-env"
    with pytest.raises(UserError, match="--max-queue"):
        check_args(args(max_queue=0))


def test_the_bound_socket_accepts_before_uvicorn_runs():
    """The banner is printed before uvicorn starts: a client that connects then must wait, not be refused."""
    import socket

    from dflash_tui.commands.serve import bind

    sock = bind("127.0.0.1", 0)
    try:
        with socket.create_connection(sock.getsockname()[:2], timeout=5):
            pass
        with pytest.raises(UserError, match="cannot listen"):
            bind("127.0.0.1", sock.getsockname()[1]).close()
    finally:
        sock.close()


def test_a_remote_replys_speed_runs_to_the_block_that_ends_it():
    """The engine's definition on the client side: the tokens after the first over the time from the
    first token's block to the last block, one that only says EOS included."""
    from dflash_tui.remote.block_tally import BlockTally

    tally = BlockTally("dflash", 4, 0.0)
    tally.add(Block(index=0, drafted=[], accepted=0, emitted=[5], text="a"), now=10.0)
    tally.add(Block(index=1, drafted=[6, 7, 8], accepted=2, emitted=[6, 7, 9], text="bcd"), now=11.0)
    tally.add(Block(index=2, drafted=[1, 2, 3], accepted=0, emitted=[2], text="", eos=True), now=13.0)
    s = tally.stats(now=13.5)
    assert s["generated_tokens"] == 4 and s["decode_tps"] == pytest.approx(3 / 3.0)
