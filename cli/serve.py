"""`deepseek-tfx serve`: the TensorFlow Serving REST API and the OpenAI API over HTTP
(uvicorn), for one or several pushed (or imported) SavedModels."""

from __future__ import annotations

import argparse

from cli import quiet_commands


def cmd_serve(args: argparse.Namespace) -> int:
    """Serves until Ctrl-C (`serving/http_app.py` on uvicorn); then prints the batching
    statistics. The port opens at once; the models warm up in the background
    (`warm_up_models`, `--warm-up`) and `ready` is printed when GET /v1/models/<name> says
    AVAILABLE (predict answers 503 until then)."""
    from config import ServeConfig
    from serving.model_split import parse_models, parse_split

    try:
        serve = ServeConfig(**{field: getattr(args, field) for field in _SERVE_FIELDS})
        dirs = parse_models(args.model, args.model_name)
        split = parse_split(args.split, dirs) if args.split else None
    except ValueError as e:
        raise SystemExit(f"error: serve: {e}") from e
    if split is not None and args.model_name in dirs:
        raise SystemExit(f"error: serve: --split needs a route name of its own: "
                         f"--model-name {args.model_name!r} is a served model's name")
    import threading

    import uvicorn

    from serving.http_app import make_app, uvicorn_config
    from serving.served_models import ServedModels
    from serving.server import ModelServer

    servers = {}
    try:
        for name, model_dir in dirs.items():
            servers[name] = ModelServer(model_dir, name, serve, warm=False)
    except FileNotFoundError as e:
        raise SystemExit(f"error: {e}") from e
    models = ServedModels(servers, split, args.model_name)
    config = uvicorn_config(make_app(models), args.host, args.port, serve)
    try:
        sock = config.bind_socket()
    except SystemExit as e:  # uvicorn logged why (e.g. the port is in use)
        raise SystemExit(f"error: serve: cannot listen on {args.host}:{args.port}") from e
    host, port = sock.getsockname()[:2]
    _print_banner(servers, split, args.model_name, f"{host}:{port}", serve)

    def warm() -> None:
        print(warm_up_models(servers, args.warm_up), flush=True)

    threading.Thread(target=warm, name="warm-up", daemon=True).start()
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        models.close()
        for server in servers.values():
            stats = server.stats()
            print(f"'{server.name}' served {stats['requests']} requests in {stats['calls']} "
                  f"model calls ({stats['rows'] / max(stats['calls'], 1):.1f} rows per call, "
                  f"at most {stats['max_rows']}; {stats['retried_batches']} failed batches "
                  f"run again request by request; {stats['refused']} refused with 503)",
                  flush=True)
    return 0


def warm_up_models(servers: dict, mode: str = "all") -> str:
    """Warms each `ModelServer` of `servers` ({name: server}) in turn, then returns the
    `ready` line.

    Args:
      servers: the served models, each still LOADING (`ModelServer(..., warm=False)`).
      mode: "all" runs the warm-up file and every signature at 1, 2, 4, ...
        max_batch_size rows, then the engine (`ModelServer.warm_up`); "engine" warms only
        the engine's two functions (the OpenAI routes' generation), leaving each
        signature to its first request (`ModelServer.warm_up(signatures=False)`, which
        warms a model without an engine's signatures either way).

    Raises:
      ValueError: `mode` is neither "all" nor "engine".
    """
    import gc

    if mode not in WARM_UP_MODES:
        raise ValueError(f"--warm-up {mode!r}: expected one of {', '.join(WARM_UP_MODES)}")
    requests = failed = 0
    seconds = 0.0
    cold = []  # the models whose signatures are left to their first requests
    for name, server in servers.items():
        done = server.warm_up(signatures=mode == "all")
        requests, failed = requests + done["requests"], failed + done["failed"]
        seconds += done["seconds"]
        if not done["signatures"]:
            cold.append(repr(name))
    # The loaded SavedModels are ~10^5-10^6 Python objects that live as long as the
    # server; out of the collector's sight, full collections stop pausing requests.
    gc.collect()
    gc.freeze()
    note = f", {failed} failed" if failed else ""
    what = (f" (engine only: the signatures of {', '.join(cold)} warm on first use)"
            if cold else "")
    return (f"ready: warmed up with {requests} requests in {seconds:.1f} s{note}{what}; "
            "state AVAILABLE")


def _print_banner(servers: dict, split, route: str, address: str, serve) -> None:
    """What `serve` serves, where, and with which batching, engine and limits."""
    for server in servers.values():
        kind = "" if server.has_tokenizer else " (no tokenizer: logits only, token ids in)"
        print(f"serving {server.path} (version {server.version}) as '{server.name}' on "
              f"http://{address}/v1/models/{server.name}", flush=True)
        print(f"  signatures: {', '.join(sorted(server.signatures))}{kind}", flush=True)
    if split is not None:
        print(f"  split: /v1/models/{route} and OpenAI requests for "
              f"'{route}' (or no model) go {split} (sticky per `user` or "
              "X-Session-Id)", flush=True)
    print(f"  OpenAI API: http://{address}/v1 (models, completions, chat/completions); "
          f"metrics: http://{address}/metrics  (Ctrl-C stops)", flush=True)
    print(f"  batching: max_batch_size {serve.max_batch_size} rows, batch_timeout_micros "
          f"{serve.batch_timeout_micros} ({serve.batch_timeout_micros / 1000:g} ms), "
          f"max_enqueued_batches {serve.max_enqueued_batches}, num_batch_threads "
          f"{serve.num_batch_threads}", flush=True)
    for server in servers.values():
        if server.engine is not None:
            e = server.engine
            print(f"  engine ('{server.name}'): decode_slots {e.slots}, slot_positions "
                  f"{e.max_len}, max_waiting_requests {e.max_waiting}", flush=True)
    print(f"  limits: max_body_bytes {serve.max_body_bytes}, max_response_bytes "
          f"{serve.max_response_bytes}, timeout_keep_alive {serve.timeout_keep_alive} s, "
          f"timeout_request_body {serve.timeout_request_body} s", flush=True)


WARM_UP_MODES = ("all", "engine")  # `serve --warm-up`: see `warm_up_models`
# ServeConfig fields with a `serve` flag each (--max-batch-size, ...): (metavar, help).
_SERVE_FIELDS = {
    "max_batch_size": ("ROWS", "most prompts (rows) in one model call, and in one request"),
    "batch_timeout_micros": ("US", "how long the oldest queued request waits for "
                                   "batch-mates, microseconds"),
    "max_enqueued_batches": ("N", "queued rows beyond N x max batch size get a 503"),
    "num_batch_threads": ("N", "batches run at the same time"),
    "max_body_bytes": ("BYTES", "largest request body, any framing (more: 413)"),
    "max_response_bytes": ("BYTES", "largest logits reply, sized before it runs "
                                    "(rows x positions x vocab x 20 bytes; more: 400)"),
    "timeout_keep_alive": ("S", "seconds an idle connection stays open (part of the "
                                "headers by then: 408)"),
    "timeout_request_body": ("S", "seconds a body may take after its headers (then 408)"),
    "decode_slots": ("N", "requests the engine decodes at once (continuous batching; 0: "
                          "the OpenAI routes use the batcher)"),
    "max_waiting_requests": ("N", "requests waiting for a decode slot (more: 503)"),
    "slot_positions": ("N", "positions per decode slot, prompt + max_tokens (0: the "
                            "model's context)"),
    "decode_steps_per_call": ("N", "decoding steps per engine call (fewer calls; an "
                                   "arrival waits up to N steps)"),
}


def add_parsers(sub) -> None:
    """Registers `serve` on `sub`, the top-level parser's `add_subparsers()`."""
    srv = sub.add_parser("serve", help="serve the newest pushed version over HTTP on the "
                         "TensorFlow Serving REST API")
    srv.add_argument("--model", required=True, action="append", metavar="[NAME=]DIR",
                     help="serving dir (its newest version is served) or a SavedModel dir "
                     "(served as version 1); repeat as NAME=DIR to serve several models")
    srv.add_argument("--port", type=int, default=8501, help="default 8501, as TF Serving's REST")
    srv.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine only)")
    srv.add_argument("--model-name", default="deepseek", help="the <name> of /v1/models/<name> "
                     "for a --model given without NAME=; with --split, the route name whose "
                     "traffic is split")
    srv.add_argument("--split", metavar="A=90,B=10",
                     help="share the --model-name route's traffic (TF Serving's and OpenAI's) "
                     "between named models, in percent; sticky per OpenAI `user` or the "
                     "X-Session-Id header")
    from config import ServeConfig

    defaults = ServeConfig()  # TF Serving's batching parameters, same names; uvicorn's
    for field, (metavar, what) in _SERVE_FIELDS.items():
        default = getattr(defaults, field)
        srv.add_argument("--" + field.replace("_", "-"), type=int, default=default,
                         metavar=metavar, help=f"{what} (default {default})")
    srv.add_argument("--warm-up", choices=WARM_UP_MODES, default="all", metavar="MODE",
                     help="all: the warm-up file and every signature at 1, 2, 4, ... max "
                     "batch size rows, then the engine (default); engine: the engine only, "
                     "for OpenAI-route traffic (ready sooner; each signature warms on its "
                     "first request)")
    quiet_commands.add_arguments(srv, "serve")
    srv.set_defaults(fn=cmd_serve)
