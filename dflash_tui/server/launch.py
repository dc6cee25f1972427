"""Start `dflash-tui serve` as a child process and wait until it answers (for the benchmark and the tests)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional, Sequence

_SERVING = re.compile(r" on http://(\[[^\]]+\]|[^:/\s]+):(\d+)/v1")


class ServerProcess:
    """`with ServerProcess(["--demo"]) as s: s.base_url` -> "http://127.0.0.1:PORT"."""

    def __init__(self, args: Sequence[str], host: str = "127.0.0.1", timeout: float = 120.0,
                 env: Optional[dict[str, str]] = None, port: int = 0) -> None:
        self.args = [*args, "--host", host, "--port", str(port)]  # 0: one the system picks
        self.timeout = timeout
        self.env = {**os.environ, **(env or {})}
        self.proc: Optional[subprocess.Popen] = None
        self.base_url = ""
        self._log = tempfile.NamedTemporaryFile("w+", prefix="dflash-serve-", suffix=".log", delete=False)

    @property
    def log_path(self) -> Path:
        return Path(self._log.name)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def start(self) -> "ServerProcess":
        self.proc = subprocess.Popen([sys.executable, "-m", "dflash_tui", "serve", *self.args], stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        end = time.monotonic() + self.timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.proc.returncode}:\n{self.log()}")
            found = _SERVING.search(self.log())
            if found and self._healthy(f"http://{found.group(1)}:{found.group(2)}"):
                self.base_url = f"http://{found.group(1)}:{found.group(2)}"
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the server did not come up in {self.timeout:.0f} s:\n{self.log()}")

    @staticmethod
    def _healthy(url: str) -> bool:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                return json.loads(r.read()).get("status") == "ok"
        except OSError:
            return False

    def stop(self, timeout: float = 15.0) -> Optional[int]:
        """SIGINT (as Ctrl-C), then SIGKILL if it does not end in time; returns its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        try:
            self.log_path.unlink()
        except OSError:
            pass
