"""`dflash-tui serve`: an OpenAI-compatible HTTP server on one DFlash engine (Starlette on uvicorn)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from dflash_tui.commands.common import (add_block_size_argument, add_distributed_arguments, add_draft_quant_argument,
                                        add_model_arguments, block_size_from_args, resolve_pair)
from dflash_tui.errors import UserError
from dflash_tui.server.openai_format import ALONE

if TYPE_CHECKING:
    from dflash_tui.engine.distributed import Ranks

API_KEY_ENV = "DFLASH_TUI_API_KEY"
DEFAULT_MAX_TOKENS_LIMIT = 4096
DEFAULT_MAX_QUEUE = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_draft_quant_argument(parser)
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    g.add_argument("--api-key", metavar="KEY", default=None,
                   help=f"require 'Authorization: Bearer KEY' (or set {API_KEY_ENV}); needed to bind beyond loopback")
    g.add_argument("--insecure", action="store_true", help="bind beyond loopback without an API key (a warning is printed)")
    g.add_argument("--max-tokens-limit", type=int, default=DEFAULT_MAX_TOKENS_LIMIT, metavar="N",
                   help=f"the most tokens one request may ask for, and the default (default {DEFAULT_MAX_TOKENS_LIMIT})")
    g.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE, metavar="N",
                   help=f"requests that may wait behind the running one; past it a request gets 429 (default {DEFAULT_MAX_QUEUE})")
    g.add_argument("--max-request-bytes", type=int, default=1 << 20, metavar="N", help="largest request body (default 1 MiB)")
    add_block_size_argument(g, default=None, default_text="0, the draft's own; a request's dflash.block_size overrides it")
    g.add_argument("--spec-decode-metrics", choices=("none", "summary", "detailed"), default="summary",
                   help="per-request speculative-decoding figures in responses, as vLLM's --per-request-spec-decode-metrics")
    g.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info")
    add_distributed_arguments(parser)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_args(args: argparse.Namespace) -> Optional[str]:
    """Refuse unsafe or impossible settings; returns the API key in force."""
    api_key = args.api_key if args.api_key is not None else (os.environ.get(API_KEY_ENV) or None)
    if api_key is not None and (not api_key.strip() or not api_key.isprintable() or len(api_key) > 512):
        raise UserError("--api-key must be 1 to 512 printable characters")
    if not is_loopback(args.host) and api_key is None:
        if not args.insecure:
            raise UserError(f"--host {args.host} would let other machines use this server: pass --api-key KEY "
                            f"(or set {API_KEY_ENV}), or --insecure to serve it open")
        print(f"dflash-tui serve: WARNING: serving on {args.host} with no API key: anyone who can reach it can use it",
              file=sys.stderr)
    if not 0 <= args.port <= 65535:
        raise UserError("--port must be between 0 and 65535")
    for name in ("max_tokens_limit", "max_queue", "max_request_bytes"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    return api_key


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads: a busy port fails at once. It listens from
    here on, so a client that reads the banner and connects before uvicorn starts waits in the backlog
    instead of being refused."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # uvicorn's own backlog
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def model_id(args: argparse.Namespace, model: str) -> str:
    """The name clients see: never a path on this machine."""
    if args.demo or not args.model:
        return "dflash-tui-demo"
    return Path(model).name if Path(model).expanduser().exists() else model


class _Terminated(Exception):
    pass


def _terminate(signum, frame) -> None:
    raise _Terminated()


def run(args: argparse.Namespace) -> int:
    from dflash_tui.commands.common import ranks_from_args

    block_size_from_args(args, ALONE)  # before anything loads, on every rank alike
    ranks = ranks_from_args(args)  # None unless --distributed
    if ranks is not None and not ranks.is_leader:  # rank 0 serves; the others follow its requests
        from dflash_tui.commands.serve_follower import follow_rank_0

        return follow_rank_0(args, ranks)
    api_key = check_args(args)
    model, draft = resolve_pair(args)
    sock = bind(args.host, args.port)
    try:
        return _serve(args, api_key, model, draft, sock, ranks)
    finally:
        sock.close()


def _serve(args: argparse.Namespace, api_key: Optional[str], model: str, draft: Optional[str], sock: socket.socket,
           ranks: "Optional[Ranks]" = None) -> int:
    import uvicorn

    from dflash_tui.engine.block_limit import refusal
    from dflash_tui.server.app import ServerConfig, build_app
    from dflash_tui.server.engine_thread import EngineThread
    from dflash_tui.server.metrics import ServerMetrics
    from dflash_tui.server.openai_format import Limits

    name = model_id(args, model)
    if ranks is None:
        engine = EngineThread(model, draft, trust_remote_code=args.trust_remote_code, block_size=args.block_size,
                              max_queue=args.max_queue, draft_quant=args.draft_quant or 0)
    else:
        from dflash_tui.server.ranked_engine import RankedEngineThread

        engine = RankedEngineThread(model, draft, ranks, trust_remote_code=args.trust_remote_code,
                                    block_size=args.block_size, max_queue=args.max_queue,
                                    draft_quant=args.draft_quant or 0)
    print(f"dflash-tui serve: loading {name} ...", file=sys.stderr, flush=True)
    engine.start()
    try:
        engine.wait_ready()
        if engine.load_error is not None:
            raise UserError(engine.load_error)
        if isinstance(args.block_size, int) and (refused := refusal(args.block_size, engine.draft_block)):
            raise UserError(refused, exit_code=2)  # at start, not a refusal on every request; a usage error
        metrics = ServerMetrics(name, engine.counts)
        engine.metrics = metrics
        limits = Limits(model_ids=(name,), max_tokens_limit=args.max_tokens_limit, block_size=args.block_size,
                        spec_metrics=args.spec_decode_metrics, draft_block=engine.draft_block)
        app = build_app(ServerConfig(engine, metrics, limits, name, api_key, args.max_request_bytes))
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        drafting = f"draft block {engine.num_spec_tokens + 1}" if engine.num_spec_tokens else "target only (no draft)"
        if ranks is not None:
            drafting += f", {ranks.size} ranks {ranks.kind} parallel"
        print(f"dflash-tui serve: {name} ({drafting}) on http://{shown}:{port}/v1"
              f"{' (API key required)' if api_key else ''}", file=sys.stderr, flush=True)
        config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=3, lifespan="off",
                                server_header=False, h11_max_incomplete_event_size=64 * 1024)
        server = uvicorn.Server(config)
        if ranks is not None:
            engine.on_fatal = lambda: setattr(server, "should_exit", True)
        previous = signal.signal(signal.SIGTERM, _terminate)  # uvicorn re-raises SIGTERM after its shutdown
        terminated = False
        try:
            server.run(sockets=[sock])
        except _Terminated:
            terminated = True
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
        if ranks is not None:
            return _ranks_ended(engine, terminated)
        print("dflash-tui serve: stopped", file=sys.stderr, flush=True)
        return 0
    finally:
        engine.stop()


def _ranks_ended(engine, terminated: bool) -> int:
    """Rank 0 after its server stopped: the one reason the ranks ended (exit 1), or a clean stop."""
    if terminated:  # mlx.launch ends the remaining ranks with SIGTERM when one of them exits
        engine.fail("stopped by mlx.launch: another rank exited (killed, or failed first)")
    if engine.fatal is None:
        engine.stop()  # a clean stop: the followers get their shutdown message
        print("dflash-tui serve: stopped", file=sys.stderr, flush=True)
        return 0
    print(f"dflash-tui serve: {engine.fatal}", file=sys.stderr, flush=True)
    # the engine thread may sit in a collective that will never complete: leave without waiting for it
    os._exit(1)
