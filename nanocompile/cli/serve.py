"""`nanocompile serve`: an OpenAI-compatible HTTP server, as llama.cpp's llama-server.

The address is bound before the model loads, so a port in use is refused at once; --port 0 takes
any free port (the line on stderr says which). Ctrl-C or SIGTERM stops it: waiting requests are
cancelled and the one being answered stops at its next token.
"""
from __future__ import annotations

import os
import signal
import socket
import sys

from ..errors import NanocompileError
from ..engine.lookup import on_by_default
from .common import (add_lookup_flags, add_model_flags, add_sampling_flags, lookup_params, open_model,
                     sampling_from, set_blas_threads)


MAX_PARALLEL = 64  # sequences; a batched step takes at most the library's chunk of rows


def bind(host: str, port: int) -> socket.socket:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=128)
    except (OSError, socket.gaierror) as e:
        raise NanocompileError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None


def default_lookup(args, model) -> None:
    """Without --lookup or --no-lookup the server drafts where its library runs 16-lane VNNI
    products (engine.lookup.on_by_default), with the other lookup flags' parameters."""
    if args.lookup is None and on_by_default(getattr(model.session, "march", None)):
        model.lookup = lookup_params(args)


def cmd_serve(args) -> int:
    set_blas_threads(args.threads)
    defaults = sampling_from(args)  # bad flags are refused before the model loads
    if args.queue < 0:
        raise NanocompileError(f"--queue must be >= 0, got {args.queue}")
    if not 1 <= args.parallel <= MAX_PARALLEL:
        raise NanocompileError(f"--parallel must be from 1 to {MAX_PARALLEL}, got {args.parallel}")
    try:
        import uvicorn

        from ..server import create_app
    except ImportError as e:
        raise NanocompileError(f"nanocompile serve needs {e.name}: pip install 'nanocompile[serve]'") from None
    api_key = args.api_key or os.environ.get("NANOCOMPILE_API_KEY") or None
    sock = bind(args.host, args.port)
    model = open_model(args, args.ctx_size)
    model.progress = False  # no prompt bars for requests
    default_lookup(args, model)
    if args.parallel > 1 and model.backend != "compiled":
        raise NanocompileError("--parallel needs the compiled backend (its batched step)")
    app = create_app(model, model_id=args.alias, api_key=api_key, max_queue=args.queue, max_body=args.max_body,
                     defaults=defaults, parallel=args.parallel)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    cfg = model.config
    cache = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4 * model.n_ctx / 2 ** 20
    at_once = "one request at a time" if args.parallel == 1 else \
        f"{args.parallel} requests at a time, their decoding batched"
    print(f"nanocompile: serving {args.alias or model.name} on http://{shown}:{port}/v1 (context {model.n_ctx} "
          f"tokens, {at_once}, KV cache {cache:.0f} MiB each, {cache * args.parallel:.0f} MiB in all; "
          f"{args.queue} more may wait{', API key required' if api_key else ''}"
          f"{', prompt lookup on' if model.lookup else ''})",
          file=sys.stderr, flush=True)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            app.state.engine.close()  # waiting requests end now, the running one at its next token
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, log_level="warning" if args.quiet else "info", access_log=not args.quiet,
                            timeout_graceful_shutdown=5)
    # uvicorn shuts down gracefully on SIGINT and SIGTERM, then raises the signal again
    signal.signal(signal.SIGTERM, _stop)
    try:
        Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    print("nanocompile: the server stopped", file=sys.stderr)
    return 0


def _stop(signum, frame):
    raise KeyboardInterrupt


def add_parser(sub) -> None:
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions)")
    add_model_flags(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine "
                                                            "only; 0.0.0.0 for every interface)")
    serve.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: any free port)")
    serve.add_argument("--api-key", help="require `Authorization: Bearer KEY` on /v1/ (or set NANOCOMPILE_API_KEY)")
    serve.add_argument("--alias", help="the model's name in /v1/models and in responses (default: its file name)")
    serve.add_argument("-c", "--ctx-size", type=int, help="context size in tokens (default: 4096 or the model's "
                                                         "maximum)")
    serve.add_argument("-np", "--parallel", type=int, default=1, metavar="N",
                       help="requests answered at once, each with a KV cache of its own (-c tokens), their decoding "
                            "steps run as one batched step (llama-server's flag; default 1)")
    serve.add_argument("--queue", type=int, default=32, help="requests that may wait while one is answered; more "
                                                             "get 503 (default 32)")
    serve.add_argument("--max-body", type=int, default=8 << 20, help="largest request body in bytes (default 8 MiB)")
    add_sampling_flags(serve)
    add_lookup_flags(serve)
    serve.set_defaults(func=cmd_serve)
