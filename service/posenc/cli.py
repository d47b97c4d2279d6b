"""The `posenc` command line: `posenc serve [--host --port --grpc-port --device ...]`.

Flags override the matching `POSENC_*` environment variables (`posenc.api.Settings`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from posenc import __version__

_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("host", str, "interface to bind (POSENC_HOST, default 127.0.0.1)"),
    ("port", int, "TCP port (POSENC_PORT, default 8000)"),
    ("grpc_port", int, "gRPC port of the Open Inference Protocol (POSENC_GRPC_PORT; off unset)"),
    ("device", str, "auto, cpu, cuda or cuda:N (POSENC_DEVICE, default auto)"),
    ("cache_bytes", int, "cache byte budget (POSENC_CACHE_BYTES)"),
    ("in_flight_bytes", int, "in-flight byte budget (POSENC_IN_FLIGHT_BYTES)"),
    ("max_response_bytes", int, "largest table served (POSENC_MAX_RESPONSE_BYTES)"),
    ("json_max_elements", int, "largest JSON table in elements (POSENC_JSON_MAX_ELEMENTS)"),
    ("max_body_bytes", int, "largest request body (POSENC_MAX_BODY_BYTES)"),
    ("max_concurrent_computations", int, "computations in flight before 503"),
    ("max_connections", int, "open connections before 503 (POSENC_MAX_CONNECTIONS)"),
    ("max_header_bytes", int, "largest request line and headers before 431"),
    ("header_timeout_seconds", float, "seconds to receive a request's headers"),
    ("body_timeout_seconds", float, "seconds to receive a request's body after its headers"),
    ("idle_timeout_seconds", float, "seconds a keep-alive connection may idle"),
    ("send_timeout_seconds", float, "seconds a response may wait for its client to read"),
    ("warm_presets", str, "comma-separated presets to compute at start-up, or 'all'"),
    ("log_format", str, "text or json (POSENC_LOG_FORMAT)"),
    ("log_level", str, "critical, error, warning, info or debug"),
    ("drain_seconds", float, "seconds readiness is 503 after SIGTERM before closing"),
    ("grace_seconds", float, "seconds in-flight requests get to finish at shutdown"),
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for `posenc`."""
    parser = argparse.ArgumentParser(prog="posenc", description=__doc__)
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP (and, with --grpc-port, gRPC) server")
    for name, kind, text in _FLAGS:
        serve.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, help=text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `posenc` console script."""
    args = build_parser().parse_args(argv)
    from posenc.api.server import serve
    from posenc.api.settings import Settings

    overrides: dict[str, Any] = {
        name: getattr(args, name) for name, _, _ in _FLAGS if getattr(args, name) is not None
    }
    try:
        settings = Settings(**overrides)
    except ValidationError as err:
        print(f"posenc: invalid settings:\n{err}", file=sys.stderr)
        return 2
    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
