"""`serve --distributed` on 2 real mlx.launch ranks (ring backend, localhost, CPU), driven by the
real `openai` client: rank 0 serves, rank 1 follows its requests headless."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import ring_port
from test_distributed import our_lines

REPO = Path(__file__).resolve().parent.parent
LAUNCH = Path(sys.executable).parent / "mlx.launch"
PROMPT = "hello there"

pytestmark = pytest.mark.skipif(not LAUNCH.exists(), reason="mlx.launch is not installed")


class Ranks2:
    """`mlx.launch --backend ring -n 2 -- dflash-tui serve … --distributed`, its output in files."""

    def __init__(self, dirs: dict[str, Path], tmp: Path, rank_timeout: float, pipeline: bool = False) -> None:
        port = ring_port()
        self.out, self.err = tmp / "launch.out", tmp / "launch.err"
        cmd = [str(LAUNCH), "--backend", "ring", "-n", "2", "--starting-port", str(port), "--",
               sys.executable, "-m", "dflash_tui", "serve", "--model", str(dirs["target"]), "--draft", str(dirs["draft"]),
               "--distributed", "--port", "0", "--rank-timeout", str(rank_timeout), *(["--pipeline"] if pipeline else [])]
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=err, start_new_session=True)
        self.url = ""

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def wait_serving(self, timeout: float = 120) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = re.search(r" on (http://127\.0\.0\.1:\d+/v1)", self.stderr())
            if found:
                self.url = found.group(1)
                return self.url
            assert self.proc.poll() is None, self.stderr()[-3000:]
            time.sleep(0.2)
        raise AssertionError("the 2-rank server did not come up:\n" + self.stderr()[-3000:])

    def rank_pids(self) -> dict[int, int]:
        """The launcher's children, by the MLX_RANK mlx.launch gave each."""
        pids = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid != self.proc.pid:
                    continue
                env = (entry / "environ").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            for var in env:
                if var.startswith(b"MLX_RANK="):
                    pids[int(var.split(b"=")[1])] = int(entry.name)
        return pids

    def wait_launcher(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the ranks did not end within {timeout:.0f} s:\n" + self.stderr()[-3000:]) from None

    def end(self, pids: dict[int, int]) -> None:
        """SIGKILL what this test started and is still running (the ranks, then the launcher)."""
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def single_process_reference(dirs: dict[str, Path], max_tokens: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "dflash_tui", "generate", PROMPT, "--model", str(dirs["target"]),
                           "--draft", str(dirs["draft"]), "--max-tokens", str(max_tokens), "--json"],
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    done = [json.loads(line) for line in proc.stdout.splitlines() if '"type": "done"' in line]
    return done[0]


def health(url: str) -> dict:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory) -> dict[str, Path]:
    from conftest import _build_pair
    from test_distributed import write_safetensors_index

    dirs = _build_pair(tmp_path_factory.mktemp("qwen3_5_serve"), "qwen3_5", seed=0)
    write_safetensors_index(dirs["target"])  # mlx-lm's pipeline loading reads it
    return dirs


@pytest.mark.parametrize("kind, parallel", [("attention", "tensor"), ("hybrid", "tensor"), ("hybrid", "pipeline")])
def test_serve_distributed_answers_as_one_process_and_reports_a_dead_rank(kind, parallel, qwen3_dirs, hybrid_dirs,
                                                                          tmp_path):
    from openai import OpenAI

    dirs = qwen3_dirs if kind == "attention" else hybrid_dirs
    ref = single_process_reference(dirs, 24)
    assert len(ref["tokens"]) == 24
    server = Ranks2(dirs, tmp_path, rank_timeout=20, pipeline=parallel == "pipeline")
    pids: dict[int, int] = {}
    try:
        url = server.wait_serving()
        pids = server.rank_pids()
        assert sorted(pids) == [0, 1]
        assert health(url)["distributed"] == {"ranks": 2, "parallel": parallel}
        client = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": PROMPT}]
        [model] = [m.id for m in client.models.list().data]

        # greedy: rank 0's reply is the single-process reply
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0)
        assert r.choices[0].message.content == ref["text"]
        assert r.usage.completion_tokens == 24

        # streamed, with the engine's block events: the Done event carries the ranks' figures
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0, stream=True,
                                                extra_body={"dflash": {"blocks": True}})
        text, done = "", None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            event = ((chunk.model_extra or {}).get("dflash") or {}).get("event") or {}
            if event.get("type") == "done":
                done = event
        assert text == ref["text"]
        assert done is not None and done["tokens"] == ref["tokens"]
        stats = done["stats"]
        assert stats["ranks"] == 2 and stats["parallel"] == parallel
        assert stats["agreement_checks"] >= stats["cycles"] + 1 and stats["sync_ms"] > 0

        # a remote TUI's engine (the block stream rebuilt into events): its meter shows the ranks
        from dflash_tui.engine.events import Done
        from dflash_tui.remote.client import RemoteClient, RemoteTarget
        from dflash_tui.ui.meter import MeterState

        remote = RemoteClient(RemoteTarget(url.removesuffix("/v1")))
        try:
            remote.connect()
            meter = MeterState()
            for ev in remote.chat(messages, {"max_tokens": 24, "temperature": 0.0}):
                if isinstance(ev, Done):
                    meter.on_done(ev)
                    assert ev.tokens == ref["tokens"]
        finally:
            remote.close()
        assert meter.ranks is not None and meter.ranks[:2] == (2, parallel) and meter.ranks[2] > 0

        # a client that hangs up mid-reply: every rank stops after the same cycle
        long = client.chat.completions.create(model=model, messages=messages, max_tokens=3000, temperature=0, stream=True)
        next(iter(long))
        long.close()
        end = time.monotonic() + 30
        while health(url)["running"] and time.monotonic() < end:
            time.sleep(0.2)
        assert health(url)["running"] == 0

        # the ranks are still in step, and the next request reuses the cache
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0)
        assert r.choices[0].message.content == ref["text"]
        assert r.usage.prompt_tokens_details.cached_tokens > 0

        # seeded sampling runs on both ranks (the seed travels with the request)
        sampled = [client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=1.0,
                                                  seed=11).choices[0].message.content for _ in range(2)]
        assert sampled[0] == sampled[1] and sampled[0] != ref["text"]

        # the follower dies: rank 0 says so in one line and exits non-zero
        before = len(server.stderr().splitlines())
        os.kill(pids[1], signal.SIGKILL)
        server.wait_launcher(60)
        after = server.stderr().splitlines()[before:]
        ours = our_lines("\n".join(after), prefix="dflash-tui serve:")
        assert len(ours) == 1, "\n".join(after)
        assert "a rank is gone or unreachable" in ours[0] or "another rank exited" in ours[0], ours[0]
        assert any("Node with rank 0 exited with code 1" in line for line in after), "\n".join(after)
    finally:
        server.end(pids)


def test_a_follower_does_not_outlive_a_hung_rank_0(qwen3_dirs, tmp_path):
    server = Ranks2(qwen3_dirs, tmp_path, rank_timeout=4)
    pids: dict[int, int] = {}
    try:
        server.wait_serving()
        pids = server.rank_pids()
        os.kill(pids[0], signal.SIGSTOP)  # rank 0 stops answering with its connections open
        end = time.monotonic() + 30
        while Path(f"/proc/{pids[1]}").exists() and time.monotonic() < end:
            time.sleep(0.2)
        assert not Path(f"/proc/{pids[1]}").exists(), (pids, Path(f"/proc/{pids[1]}/stat").read_text(), server.stderr())
        assert "Node with rank 1 exited with code 1" in server.stderr()
    finally:
        server.end(pids)
