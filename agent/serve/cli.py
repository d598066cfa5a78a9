"""`flywheel serve` on the command line: flags, the listening socket, the engine, uvicorn.

    flywheel serve --model path/to/checkpoint --speculative ngram --port 8000

The port is bound before the model loads, so a busy port is one line on stderr and exit 2 at
once. `--model registry` serves the registry's promoted version and follows it (agent/registry.py
`RegistryWatcher`); only a version whose files verify against its manifest is loaded. With
`--lane completion` it serves and follows the version that serves the editor's completions
instead (a second server, for a client that asks for inline completions over HTTP).
"""

import argparse
import errno
import logging
import socket
import sys

from agent.engine import EngineConfig, EngineError, SpeculativeConfig
from agent.engine.config import APPLY_COPY_BIAS, DRAFT_ALTERNATIVES, DTYPES, SPEC_METHODS
from agent.model import add_model_argument
from agent.registry import LANES, Registry, RegistryError, RegistryWatcher, path_from_cli
from agent.serve.app import ServerConfig, build_app


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flywheel serve",
        description="OpenAI-compatible HTTP server over the engine (/v1/models, /v1/completions, "
        "/v1/chat/completions with SSE streaming and tool calls, /metrics, /health).",
    )
    m = p.add_argument_group("model")
    add_model_argument(m)
    m.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "local", "vllm", "openai"],
        help="engine backend; auto: URL -> openai, else local (default: %(default)s)",
    )
    m.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    m.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="weights; int8, int4: low-bit copies for decoding on the CPU, lossy "
        "(agent/engine/local/lowbit.py; default: %(default)s)",
    )
    m.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=512,
        help="memory for cached prompt prefixes, local backend; 0 turns it off (default: %(default)s)",
    )
    m.add_argument(
        "--exact",
        action="store_true",
        help="local backend: every output the bits of a cold, unbatched, plain decode; under "
        "int8 or int4, prefill takes the low-bit product too (slower cold prefill)",
    )
    m.add_argument(
        "--apply-copy-bias",
        type=float,
        default=APPLY_COPY_BIAS,
        help="fast-apply requests, local backend: logit bonus of the tokens that continue the "
        "original file or the edit sketch; 0 turns it off (default: %(default)s)",
    )
    m.add_argument(
        "--served-model-name",
        default="flywheel",
        help="model id reported in /v1/models and expected in requests (default: %(default)s)",
    )
    s = p.add_argument_group("speculative decoding")
    s.add_argument(
        "--speculative",
        default="none",
        choices=SPEC_METHODS,
        help="where draft tokens come from (default: %(default)s)",
    )
    s.add_argument(
        "--num-draft",
        type=int,
        default=4,
        help="draft tokens per verify step, the start value (default: %(default)s)",
    )
    s.add_argument(
        "--draft-alternatives",
        type=int,
        default=DRAFT_ALTERNATIVES,
        help="MTP: alternatives to the first draft, verified as a tree (0: a chain; default: "
        "%(default)s)",
    )
    s.add_argument("--draft-model", default=None, help="checkpoint folder of the draft model")
    r = p.add_argument_group("model registry (with --model registry)")
    r.add_argument(
        "--registry",
        default=None,
        help="registry folder whose promoted version to serve and follow "
        "(default: $FLYWHEEL_REGISTRY or $XDG_DATA_HOME/flywheel/models)",
    )
    r.add_argument(
        "--lane",
        choices=LANES,
        default="agent",
        help="the lane to serve and follow: agent (the promoted version) or completion (the "
        "version serving inline completions; the promoted one until a completion version is "
        "promoted) (default: %(default)s)",
    )
    r.add_argument(
        "--reload-interval",
        type=float,
        default=2.0,
        help="seconds between checks for a newly promoted version (also checked before "
        "each request) (default: %(default)s)",
    )
    h = p.add_argument_group("HTTP")
    h.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    h.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
    h.add_argument(
        "--api-key",
        default=None,
        help="require `Authorization: Bearer KEY` on every route but /health",
    )
    return p


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (raises OSError: busy port, unknown host, ...)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not a busy port: TIME_WAIT
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def _why(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "the port is in use (another server?); stop it or choose another with --port"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need root); choose another with --port"
    return exc.strerror or str(exc)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        server = ServerConfig(args.host, args.port, args.api_key, args.served_model_name)
        config = EngineConfig(
            model=args.model,
            backend=args.backend,
            device=args.device,
            dtype=args.dtype,
            prefix_cache_mb=args.prefix_cache_mb,
            apply_copy_bias=args.apply_copy_bias,
            exact=args.exact,
            own_thread=True,  # requests arrive on the HTTP server's threads
            speculative=SpeculativeConfig(
                method=args.speculative,
                num_draft_tokens=args.num_draft,
                max_draft_tokens=max(8, args.num_draft),
                draft_model=args.draft_model,
                draft_alternatives=args.draft_alternatives,
            ),
        )
        from agent.engine import open_engine

        registry = None
        if args.reload_interval <= 0:
            raise EngineError(f"--reload-interval must be > 0 seconds, got {args.reload_interval}")
        if args.lane != "agent" and args.model != "registry":
            raise EngineError("--lane names a registry lane: use it with --model registry")
        if args.model == "registry":
            registry = Registry(path_from_cli(args.registry))
            serving = registry.serving(args.lane)
            if serving is None:
                raise EngineError(
                    f"no version of the registry {registry.root} is promoted yet: "
                    "flywheel models add PATH --promote --force, or flywheel cycle"
                )
            config.model = str(registry.verify(serving))
        try:  # before the model loads: a busy port is one line and exit 2 at once, and the
            # "serving on" line below is true when it is printed
            sock = _listen(server.host, server.port)
        except OSError as exc:
            print(
                f"flywheel serve: cannot listen on {args.host}:{args.port}: {_why(exc)}",
                file=sys.stderr,
            )
            return 2
        try:
            engine = open_engine(config)
        except BaseException:
            sock.close()
            raise
    except (EngineError, RegistryError) as exc:
        print(f"flywheel serve: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    watcher = None
    if registry is not None:
        watcher = RegistryWatcher(
            registry,
            engine.swap,
            engine.model_version,
            interval_s=args.reload_interval,
            lane=args.lane,
        )
        watcher.start()
    try:
        app = build_app(engine, server, watcher)
        port = sock.getsockname()[1]  # the one the system chose for --port 0
        print(
            f"flywheel serve: {engine.model_version} on http://{server.host}:{port}/v1", flush=True
        )
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    finally:
        sock.close()
        if watcher is not None:
            watcher.stop()
        engine.close()
    return 0
