"""`edgeflash serve`: an OpenAI-compatible HTTP server (and the web chat page) for one model."""

from __future__ import annotations

import argparse
import sys

from edgeflash.cli.args import (
    add_advanced_engine_options,
    add_advanced_sampling_options,
    add_everyday_engine_options,
    add_everyday_sampling_options,
    add_model_option,
    advanced_group,
    load_kwargs,
    non_negative_float,
    non_negative_int,
    positive_int,
    sampling_kwargs,
    warn_without_chat_template,
)
from edgeflash.cli.ranks import add_rank_options

HELP = "serve a model over HTTP with the OpenAI API shape (and a web chat page)"
DESCRIPTION = """Serve MODEL on an OpenAI-compatible HTTP API: POST /v1/chat/completions and
/v1/completions (streaming or not; penalties, logprobs, n, JSON response_format, tools),
GET /v1/models, GET /health, GET /metrics (Prometheus), and a chat page at /.

One engine serves every client: requests wait in a queue (at most --max-queue of them) and
run one at a time. The server listens on 127.0.0.1 (this machine only) unless --host says
otherwise. Ctrl-C or SIGTERM stops it after the running request (within --shutdown-grace).

Fields a request omits take the sampling options below (llama.cpp's defaults; --temp 0
for greedy). Any model name in a request is accepted: this server has one model.

examples:
  edgeflash serve
  edgeflash serve -m model.gguf --port 8080 --max-tokens 256 --max-queue 4
  edgeflash serve --host 0.0.0.0 --api-key "$(cat key.txt)" --cors-origin https://example.com
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_option(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; anything but loopback is reachable from other machines "
                        "(default: %(default)s)")
    p.add_argument("--port", type=non_negative_int, default=8000, help="0 picks a free port (default: %(default)s)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--max-tokens", type=positive_int, default=512,
                   help="largest max_tokens a request may ask for, and the default (default: %(default)s)")
    add_everyday_sampling_options(p)
    add_everyday_engine_options(p)
    p.add_argument("--quiet", action="store_true", help="no access log lines on stderr")
    adv = advanced_group(p)
    adv.add_argument("--model-id", default=None,
                     help="the name /v1/models lists (default: the model file's name without .gguf)")
    adv.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN", dest="cors_origins",
                     help="let web pages from ORIGIN (e.g. https://example.com, or * for any) call the API from a "
                          "browser (repeatable; default: none)")
    adv.add_argument("--max-queue", type=non_negative_int, default=8,
                     help="requests that may wait while one runs; more get HTTP 503 (default: %(default)s)")
    adv.add_argument("--max-prompt-tokens", type=positive_int, default=2048,
                     help="longer prompts get HTTP 400; the context length caps it too (default: %(default)s)")
    adv.add_argument("--max-body-bytes", type=positive_int, default=1 << 20,
                     help="larger request bodies get HTTP 413 (default: %(default)s)")
    adv.add_argument("--shutdown-grace", type=non_negative_float, default=10.0, metavar="SECONDS",
                     help="how long the running request may finish on shutdown (default: %(default)s)")
    add_advanced_sampling_options(p)
    add_advanced_engine_options(p)
    add_rank_options(p)
    p.set_defaults(run=run)


def default_model_id(model: str) -> str:
    """A name without spaces for /v1/models: the GGUF file's stem, or the folder's name."""
    from edgeflash.base.models import resolve_model

    path = resolve_model(model)
    return path.stem if path.suffix.lower() == ".gguf" else path.resolve().name


def run(args: argparse.Namespace) -> int:
    import edgeflash as ef
    from edgeflash.cli.ranks import load_on_ranks
    from edgeflash.runtime.distributed.comm import launched_by_mpi
    from edgeflash.server import Server, ServerConfig
    from edgeflash.server.network import exposure_warning

    config = ServerConfig(  # checked before the model loads, so a bad flag fails fast
        host=args.host, port=args.port, model_id=args.model_id or default_model_id(args.model),
        aliases=(str(args.model),),
        max_queue=args.max_queue, max_tokens=args.max_tokens, max_prompt_tokens=args.max_prompt_tokens,
        max_body_bytes=args.max_body_bytes, api_key=args.api_key, shutdown_grace_s=args.shutdown_grace,
        sampling_defaults=sampling_kwargs(args), access_log=not args.quiet, cors_origins=tuple(args.cors_origins))
    if launched_by_mpi():  # rank 0 serves a split model; the other ranks run what it asks
        model, comm, _ = load_on_ranks(args, lead=True)
        if comm.rank != 0:
            model.engine.follow()
            return 0
    else:
        model = ef.load(args.model, **load_kwargs(args))
    warn_without_chat_template(model)
    config.aliases += (model.name,)
    server = Server(model, config)

    def ready(s: Server) -> None:
        if not s.loopback_only:
            sys.stderr.write(exposure_warning(s.address, s.port, config.api_key is not None) + "\n")
        print(f"edgeflash serve: {s.model_id} ({model.engine.name} engine, context "
              f"{model.engine.context_length}) listening on {s.url} (chat page at {s.url}/); "
              "Ctrl-C stops", flush=True)

    try:
        server.serve_until_signal(on_ready=ready)
    finally:
        if launched_by_mpi():
            model.engine.close()  # releases the other ranks
    print("edgeflash serve: stopped", flush=True)
    return 0
