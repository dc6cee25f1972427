"""Ctrl+C to `dflash-tui serve` while requests run: a real server, real openai clients in processes
of their own, a real SIGINT. Each open request ends with one short error, the log has no traceback,
and uvicorn never waits out its 3 s grace period (it cancels nothing), with the status of an idle Ctrl+C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

pytest.importorskip("openai")

from dflash_tui.server.launch import ServerProcess  # noqa: E402
from test_serve import wait_for  # noqa: E402

LONG = 20000  # more than the tiny target writes before its EOS: the request is still running at Ctrl+C
CLIENT = r"""
import json, sys, openai
url, mode, content = sys.argv[1:4]
client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
print("READY", flush=True)
sys.stdin.readline()  # sent only when told: the import above is not in the window the test times
ask = dict(model="target", messages=[{"role": "user", "content": content}], max_tokens=int(sys.argv[4]))
out = {"text": ""}
try:
    if mode == "stream":
        for chunk in client.chat.completions.create(**ask, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                if not out["text"]:
                    print("TEXT", flush=True)
                out["text"] += chunk.choices[0].delta.content
    else:
        out["text"] = client.chat.completions.create(**ask).choices[0].message.content
    out["end"] = "complete"
except openai.APIError as exc:
    out.update(end=type(exc).__name__, status=getattr(exc, "status_code", None), message=str(exc))
print(json.dumps(out), flush=True)
"""


def client(base_url: str, mode: str, content: str) -> subprocess.Popen:
    """A client process with openai imported, which sends its request once `send` tells it to."""
    return subprocess.Popen([sys.executable, "-c", CLIENT, base_url, mode, content, str(LONG)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ready(proc: subprocess.Popen) -> None:
    assert proc.stdout.readline().strip() == "READY", proc.stderr.read()[-2000:]


def send(proc: subprocess.Popen) -> None:
    proc.stdin.write("go\n")
    proc.stdin.flush()


def health(server: ServerProcess) -> dict:
    import urllib.request

    with urllib.request.urlopen(server.base_url + "/health", timeout=5) as r:
        return json.loads(r.read())


def result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=30)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"the client printed no result: {out!r} {err[-2000:]!r}"
    return json.loads(lines[-1])


@pytest.mark.parametrize("running", ["stream", "plain"])
def test_ctrl_c_ends_running_and_waiting_requests_with_one_error_each(qwen3_dirs, running):
    args = ["--model", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["draft"]),
            "--max-tokens-limit", str(LONG), "--log-level", "info"]
    waiting = "plain" if running == "stream" else "stream"
    clients: list[subprocess.Popen] = []
    with ServerProcess(args, env={"HF_HUB_OFFLINE": "1"}) as s:
        try:
            # both clients start before either sends: the tiny target ends its reply (EOS) after a few
            # seconds, so the second request must arrive while the first still runs, even on a loaded machine
            first = client(s.base_url, running, "hello again")
            second = client(s.base_url, waiting, "hello")
            clients += [first, second]
            ready(first)
            ready(second)
            send(first)
            if running == "stream":
                assert first.stdout.readline().strip() == "TEXT"  # the reply is being written
            else:
                assert wait_for(lambda: health(s)["running"] == 1, timeout=30)
            send(second)
            assert wait_for(lambda: health(s)["waiting"] == 1, timeout=30), health(s)
            assert first.poll() is None and health(s)["running"] == 1

            s.proc.send_signal(signal.SIGINT)
            status = s.proc.wait(timeout=30)
            got = {mode: result(p) for mode, p in zip((running, waiting), clients)}
        finally:
            for p in clients:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        log = s.log()
    assert status == 0, log  # as Ctrl+C with nothing running
    # uvicorn says so where it waited out its grace period and cancelled what still ran (not a timing: a
    # loaded machine stretches a quick stop past the 3 s as well)
    assert "timeout graceful shutdown exceeded" not in log, log
    assert "Traceback" not in log and "ERROR" not in log and "CancelledError" not in log, log
    assert log.rstrip().splitlines()[-1] == "dflash-tui serve: stopped", log
    # plain: a 503 whose message says why; streamed: the stream's own error event, not a dropped connection
    assert got["plain"]["end"] == "InternalServerError" and got["plain"]["status"] == 503, got
    assert got["stream"]["end"] == "APIError", got
    for mode in ("plain", "stream"):
        assert "the server is shutting down" in got[mode]["message"], got
    if running == "stream":
        assert got["stream"]["text"]  # what was written before Ctrl+C reached the client
