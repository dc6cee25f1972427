"""DFlash with the target sharded over 2 real mlx.launch ranks (ring backend, localhost, CPU).

Each test starts `mlx.launch --backend ring -n 2` on tiny real-format pairs;
the ranks load the target with mlx-lm's own `sharded_load` (tensor parallel).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import _build_pair, ring_port

REPO = Path(__file__).resolve().parent.parent
RANK_SCRIPT = Path(__file__).resolve().parent / "distributed_rank.py"
LAUNCH = Path(sys.executable).parent / "mlx.launch"

pytestmark = pytest.mark.skipif(not LAUNCH.exists(), reason="mlx.launch is not installed")


def launch(argv: list[str], pid_dir: Path, timeout: float = 120) -> tuple[str, str]:
    """Run argv on 2 local ranks; (stdout, stderr). Any rank left behind is ended by its pid."""
    pid_dir.mkdir(parents=True, exist_ok=True)
    port = ring_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [str(LAUNCH), "--backend", "ring", "-n", "2", "--starting-port", str(port), "--", sys.executable, *argv]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=1)
                return out, err
            except subprocess.TimeoutExpired:
                pass
            # rank 0 gone (it reported): a stopped rank would keep the launcher waiting, end it
            if not alive(pid_dir / "rank0.pid") or time.monotonic() > deadline:
                end_ranks(pid_dir)
                if time.monotonic() > deadline:
                    proc.kill()
    finally:
        end_ranks(pid_dir)


def alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (FileNotFoundError, ValueError):
        return True  # not started yet
    except ProcessLookupError:
        return False
    return True


def end_ranks(pid_dir: Path) -> None:
    """SIGKILL the rank processes this test started (by the pids they wrote)."""
    for f in pid_dir.glob("rank*.pid"):
        try:
            os.kill(int(f.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def rank_results(folder: Path) -> dict[int, dict]:
    """The results each rank wrote (tests/distributed_rank.py), by rank."""
    found = [json.loads(f.read_text()) for f in folder.glob("rank*.json")]
    return {d["rank"]: d for d in found}


def our_lines(err: str, prefix: str = "dflash-tui:") -> list[str]:
    """Our lines on stderr. mlx.launch prints a warning in pieces (its colour and "[WARN]", then
    the text) from another thread than the one passing the ranks' output on, so a rank's line
    can start right after a warning's first piece: each is taken from `prefix` on."""
    return [line[line.index(prefix):] for line in err.splitlines() if prefix in line]


def write_safetensors_index(folder: Path) -> None:
    """model.safetensors.index.json, as sharded checkpoints have it (mlx-lm's pipeline loading reads it)."""
    raw = (folder / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])
    weight_map = {name: "model.safetensors" for name in header if name != "__metadata__"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory) -> dict[str, Path]:
    dirs = _build_pair(tmp_path_factory.mktemp("qwen3_5_dist"), "qwen3_5", seed=0)
    write_safetensors_index(dirs["target"])
    return dirs


@pytest.mark.parametrize("kind, parallel", [("attention", "tensor"), ("hybrid", "tensor"), ("hybrid", "pipeline")])
def test_sharded_greedy_equals_mlx_lm_sharded_generation(kind, parallel, qwen3_dirs, hybrid_dirs, tmp_path):
    dirs = qwen3_dirs if kind == "attention" else hybrid_dirs
    _, err = launch([str(RANK_SCRIPT), "--target", str(dirs["target"]), "--draft", str(dirs["draft"]),
                     "--kind", parallel, "--max-tokens", "24", "--dir", str(tmp_path)], tmp_path)
    results = rank_results(tmp_path)
    assert sorted(results) == [0, 1], err[-2000:]
    # the draft reads the same features and the target gives the same logits on every rank: a
    # pipeline stage's layers are computed whole (exact); tensor parallel sums partial products
    assert results[0]["features"]["digest"] == results[1]["features"]["digest"]
    # on a failure, whether the generations were right too: tells a wrong forward from a wrong comparison
    runs = {r: {name: run["tokens"] == res["reference"] for name, run in res["runs"].items()} for r, res in results.items()}
    for res in results.values():
        f = res["features"]
        if parallel == "pipeline":
            assert f["feature_diff"] == 0.0 and f["logit_diff"] == 0.0, (f, runs)
        else:
            assert f["feature_diff"] <= 1e-4 * f["feature_scale"], (f, runs)
    for rank, res in results.items():
        ref = res["reference"]
        assert len(ref) == 24
        for name in ("draft4", "oracle4", "oracle16", "auto"):
            run = res["runs"][name]
            assert run["tokens"] == ref, f"rank {rank} {name}"
            assert run["ranks"] == 2 and run["sync_ms"] > 0
            assert run["checks"] == len(run["blocks"]) + 1  # every cycle and the first token were checked
        partial = [a for b, a in res["runs"]["oracle4"]["blocks"] + res["runs"]["oracle16"]["blocks"] if 0 < a < b]
        assert partial, "the oracle runs must include partial accepts"
        assert {b for b, _ in res["runs"]["oracle16"]["blocks"]} >= {15}
    assert results[0]["runs"]["sampled"]["tokens"] == results[1]["runs"]["sampled"]["tokens"]
    assert results[0]["runs"]["sampled"]["tokens"] != results[0]["reference"]  # it did sample


@pytest.mark.parametrize("fault, says", [
    ("disagree", "the ranks disagree"),
    ("kill", ("a rank is gone or unreachable", "another rank exited")),
    ("hang", "no answer from the other ranks for 3 s"),
])
def test_a_failing_rank_ends_the_run_with_one_line(fault, says, qwen3_dirs, tmp_path):
    _, err = launch([str(RANK_SCRIPT), "--target", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["draft"]),
                     "--max-tokens", "12", "--blocks", "4", "--fault", fault, "--timeout", "3",
                     "--dir", str(tmp_path)], tmp_path, timeout=60)
    assert rank_results(tmp_path) == {}
    lines = our_lines(err)
    assert len(lines) == 1, err[-2000:]
    assert any(text in lines[0] for text in ((says,) if isinstance(says, str) else says)), lines[0]


def test_a_sharded_forward_after_mlx_lm_generation_is_the_same_on_every_rank(qwen3_dirs, tmp_path):
    # mlx-lm's stream_generate starts the next step's forward before yielding; a reader that stops
    # leaves it in flight, and its all-reduces then paired up with the next forward's (6 of 8 rounds)
    _, err = launch([str(RANK_SCRIPT), "--target", str(qwen3_dirs["target"]), "--draft", str(qwen3_dirs["draft"]),
                     "--reference-rounds", "8", "--dir", str(tmp_path)], tmp_path)
    results = rank_results(tmp_path)
    assert sorted(results) == [0, 1], err[-2000:]
    assert [results[r]["mixed"] for r in (0, 1)] == [0, 0]


def test_generate_cli_distributed_prints_on_rank_0_only(qwen3_dirs, tmp_path):
    out, err = launch(["-m", "dflash_tui", "generate", "hello there", "--model", str(qwen3_dirs["target"]),
                       "--draft", str(qwen3_dirs["draft"]), "--max-tokens", "12", "--block-size", "4",
                       "--distributed", "--json"], tmp_path)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    done = [e for e in events if e.get("type") == "done"]
    assert len(done) == 1, (out[-2000:], err[-2000:])  # rank 1 printed nothing
    stats = done[0]["stats"]
    assert stats["ranks"] == 2 and stats["parallel"] == "tensor" and stats["agreement_checks"] >= 2
    assert len(done[0]["tokens"]) == 12


def test_pipeline_on_a_model_mlx_lm_cannot_pipeline_is_one_line(qwen3_dirs, tmp_path):
    out, err = launch(["-m", "dflash_tui", "generate", "hello there", "--model", str(qwen3_dirs["target"]),
                       "--draft", str(qwen3_dirs["draft"]), "--max-tokens", "4", "--distributed", "--pipeline"], tmp_path)
    lines = our_lines(err)
    assert len(lines) == 1, err[-2000:]
    assert "(pipeline parallel)" in lines[0] and "does not support pipelining" in lines[0], lines[0]
    assert out.strip() == ""


def test_distributed_outside_mlx_launch_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "dflash_tui", "generate", "hi", "--demo", "--distributed"],
                          cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith("MLX_")})
    assert proc.returncode != 0
    assert our_lines(proc.stderr) == [line for line in proc.stderr.splitlines() if line.strip()]
    assert "mlx.launch" in proc.stderr


FOLLOWER = """
import os, signal, sys, threading
from dflash_tui.engine.distributed import Ranks
from dflash_tui.errors import UserError

class Group:  # rank 1 of 2: what Ranks reads of an mx.distributed group
    def rank(self): return 1
    def size(self): return 2

ranks = Ranks(Group())
ranks.stop_on_sigterm()
if sys.argv[1] == "launcher-ends-it":  # rank 0 met the same failure, exited; mlx.launch sends SIGTERM
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
ranks.follower_failed(UserError("the model has no weights \\x1b[31min /tmp/x\\nhere"), grace_s=float(sys.argv[2]))
"""


@pytest.mark.parametrize("case, grace, says", [("launcher-ends-it", 30, []),
                                                ("alone", 0.3, ["dflash-tui: rank 1: the model has no weights "
                                                                "␛[31min /tmp/x␊here"])])
def test_a_failed_follower_leaves_rank_0_the_report_or_says_it_itself(case, grace, says):
    """A follower's failure waits for mlx.launch's SIGTERM (rank 0 exited reporting it: silent);
    a failure of that rank alone is its own one line after the grace."""
    tic = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", FOLLOWER, case, str(grace)], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 1, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()] == says
    assert time.monotonic() - tic < 20  # the SIGTERM ended the wait, not the 30-s grace
