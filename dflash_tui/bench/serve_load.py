"""Benchmark (not a test): `dflash-tui serve` under N concurrent streaming clients.

Starts a server on 127.0.0.1 (or uses --url), sends one warm-up request, then
lets N clients start together, each sending --rounds streamed requests in turn.
Reports requests per second (completed requests over the wall time from the
first send to the last reply), time to first token as the client sees it (the
first content chunk; p50/p95), end-to-end latency, output tokens per second
and the mean acceptance length. The engine is one: requests are served one at
a time in arrival order, so a client's time to first token includes the
replies queued before it.

    python -m dflash_tui.bench.serve_load --demo --clients 20 --max-tokens 64
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "demo" / "heldout_prompts.jsonl"


@dataclass
class Sample:
    ok: bool
    ttft_s: Optional[float]
    e2e_s: float
    completion_tokens: int = 0
    mean_acceptance_length: Optional[float] = None
    error: str = ""


def percentile(values: list[float], q: float) -> Optional[float]:
    """Linear interpolation between the closest ranks (as numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def one_request(base_url: str, api_key: Optional[str], prompt: str, max_tokens: int, timeout: float) -> Sample:
    """One streamed chat completion over plain HTTP; times measured on this side."""
    url = urlparse(base_url)
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "stream": True,
                       "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    start = time.perf_counter()
    ttft = None
    tokens, accept = 0, None
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
        r = conn.getresponse()
        if r.status != 200:
            return Sample(False, None, time.perf_counter() - start, error=f"HTTP {r.status}: {r.read()[:200]!r}")
        for raw in r:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if "error" in data:
                return Sample(False, ttft, time.perf_counter() - start, error=data["error"].get("message", ""))
            choices = data.get("choices") or []
            if ttft is None and choices and choices[0]["delta"].get("content"):
                ttft = time.perf_counter() - start
            if data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
            spec = (data.get("metrics") or {}).get("speculative_decoding")
            if spec:
                accept = spec["mean_acceptance_length"]
    except (OSError, ValueError) as exc:
        return Sample(False, ttft, time.perf_counter() - start, error=f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
    return Sample(True, ttft, time.perf_counter() - start, tokens, accept)


def run_load(base_url: str, api_key: Optional[str], prompts: list[str], clients: int, rounds: int, max_tokens: int,
             timeout: float) -> dict[str, Any]:
    samples: list[Sample] = []
    lock = threading.Lock()
    gate = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        gate.wait()
        for r in range(rounds):
            s = one_request(base_url, api_key, prompts[(i * rounds + r) % len(prompts)], max_tokens, timeout)
            with lock:
                samples.append(s)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    gate.wait()
    began = time.perf_counter()
    for t in threads:
        t.join(timeout * rounds + 10)
    wall = time.perf_counter() - began
    good = [s for s in samples if s.ok]
    ttfts = [s.ttft_s for s in good if s.ttft_s is not None]
    e2e = [s.e2e_s for s in good]
    accepts = [s.mean_acceptance_length for s in good if s.mean_acceptance_length is not None]
    tokens = sum(s.completion_tokens for s in good)
    return {
        "clients": clients, "rounds": rounds, "max_tokens": max_tokens, "requests": len(samples), "ok": len(good),
        "errors": sorted({s.error for s in samples if not s.ok}),
        "wall_s": wall, "requests_per_s": len(good) / wall if wall > 0 else 0.0,
        "output_tokens": tokens, "output_tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "ttft_p50_s": percentile(ttfts, 0.5), "ttft_p95_s": percentile(ttfts, 0.95),
        "e2e_p50_s": percentile(e2e, 0.5), "e2e_p95_s": percentile(e2e, 0.95),
        "mean_acceptance_length": sum(accepts) / len(accepts) if accepts else None,
        "samples": [asdict(s) for s in samples],
    }


def read_prompt_file(path: Path) -> list[str]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            out.append(str(json.loads(line)["prompt"]) if line.startswith("{") else line)
    if not out:
        raise SystemExit(f"no prompts in {path}")
    return out


def main(argv: Optional[list[str]] = None) -> int:
    from dflash_tui.commands.common import add_model_arguments

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(p)
    p.add_argument("--url", help="an already running server (default: start one on 127.0.0.1 with the model arguments)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--rounds", type=int, default=1, help="requests each client sends, one after the other")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="JSONL with a 'prompt' field, or one per line")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not 1 <= args.clients <= 256 or not 1 <= args.rounds <= 100:
        p.error("--clients must be 1..256 and --rounds 1..100")
    prompts = read_prompt_file(args.prompts)
    if args.url:
        report = _bench(args, args.url, prompts)
    else:
        from dflash_tui.server.launch import ServerProcess

        model_args = ["--demo"] if args.demo or not args.model else ["--model", args.model] + (["--draft", args.draft] if args.draft else [])
        with ServerProcess([*model_args, "--max-queue", str(args.clients), "--log-level", "warning"]) as server:
            report = _bench(args, server.base_url, prompts)
            report["server"] = "started for this run: " + " ".join(model_args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        def ms(v: Optional[float]) -> str:
            return "n/a" if v is None else f"{v * 1000:.0f} ms"

        print(f"{report['ok']}/{report['requests']} requests from {args.clients} concurrent clients "
              f"({args.max_tokens} tokens max) in {report['wall_s']:.2f} s")
        print(f"  requests/s {report['requests_per_s']:.2f}   output tok/s {report['output_tokens_per_s']:.1f}")
        print(f"  TTFT p50 {ms(report['ttft_p50_s'])}   p95 {ms(report['ttft_p95_s'])}")
        print(f"  latency p50 {ms(report['e2e_p50_s'])}   p95 {ms(report['e2e_p95_s'])}")
        if report["mean_acceptance_length"] is not None:
            print(f"  mean acceptance length {report['mean_acceptance_length']:.2f}")
        for e in report["errors"]:
            print(f"  error: {e}")
    return 0 if report["ok"] == report["requests"] else 1


def _bench(args: argparse.Namespace, url: str, prompts: list[str]) -> dict[str, Any]:
    warm = one_request(url, args.api_key, prompts[0], 8, args.timeout)  # compile and first-touch costs, not counted
    if not warm.ok:
        raise SystemExit(f"the warm-up request failed: {warm.error}")
    return run_load(url, args.api_key, prompts, args.clients, args.rounds, args.max_tokens, args.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
