"""The `posenc` command line: `posenc serve [--host --port --grpc-port --device ...]`.

`posenc serve` has one flag per `posenc.api.Settings` field, generated from the class (`--name`
for the field `name`, its description, its `POSENC_NAME` variable and its default in `--help`;
booleans as `--name/--no-name`), so no setting lacks a flag. Flags override the environment.
A configuration error (a value the settings refuse, a user preset that cannot be served, an
unknown warm preset, a device this machine lacks) is one line on stderr and exit 2, before
anything starts; `POSENC_*` variables no setting reads are warned about (with the closest valid
name).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from posenc import __version__

log = logging.getLogger("posenc.cli")

_SECRET_FIELDS = frozenset({"api_keys"})


def flag_name(field: str) -> str:
    """The `posenc serve` flag of a `Settings` field: `--cache-bytes` for `cache_bytes`."""
    return "--" + field.replace("_", "-")


def _default_text(name: str, info: FieldInfo) -> str:
    from posenc.api.settings import format_bytes

    if info.default_factory is not None:
        return "none"
    value = info.default
    if value is None:
        return "off"
    if isinstance(value, bool):
        return "on" if value else "off"
    if name.endswith("_bytes") and isinstance(value, int):
        human = format_bytes(value)
        return human if human == str(value) else f"{human} ({value})"
    return str(value) if value != "" else "none"


def _metavar(name: str, info: FieldInfo) -> str:
    if name.endswith("_bytes"):
        return "SIZE"
    if name.endswith("_seconds"):
        return "SECONDS"
    if info.annotation is int or name.endswith("port"):
        return "N"
    return name.rpartition("_")[2].upper()


def _add_flags(parser: argparse.ArgumentParser) -> None:
    from posenc.api.settings import Settings, env_name

    for name, info in Settings.model_fields.items():
        text = (info.description or name.replace("_", " ")).replace("%", "%%")
        if name.endswith("_bytes"):
            text += " (a size: 4GiB, 512MiB, 1.5GB or bytes)"
        text += f" [env {env_name(name)}; default: {_default_text(name, info)}]"
        if info.annotation is bool:
            parser.add_argument(
                flag_name(name),
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=text,
            )
        else:
            parser.add_argument(
                flag_name(name),
                dest=name,
                metavar=_metavar(name, info),
                default=argparse.SUPPRESS,
                help=text,
            )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for `posenc`; `serve`'s flags are generated from `Settings`."""
    parser = argparse.ArgumentParser(prog="posenc", description=__doc__)
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the HTTP (and, with --grpc-port, gRPC) server",
        description="Run the posenc server. Every flag has a POSENC_* environment variable; "
        "a flag overrides its variable.",
    )
    _add_flags(serve)
    return parser


def describe_error(err: ValidationError) -> str:
    """A `ValidationError` of `Settings` as one line naming each field's flag and variable (a
    secret's value never shown)."""
    from posenc.api.settings import env_name

    parts = []
    for item in err.errors(include_url=False):
        message = item["msg"].removeprefix("Value error, ")
        loc = item.get("loc") or ()
        field = str(loc[0]) if loc else ""
        if not field:
            parts.append(message)
            continue
        value = item.get("input")
        secret = field in _SECRET_FIELDS
        shown = "" if secret or f"got {value!r}" in message else f" (got {value!r})"
        if field == "port" and isinstance(value, str) and value.startswith("tcp://"):
            shown += (
                ": a Kubernetes service link of a Service named posenc; set "
                "enableServiceLinks: false on the pod"
            )
        parts.append(f"{flag_name(field)} ({env_name(field)}): {message}{shown}")
    return "; ".join(parts)


def check_startup(settings: Any) -> str | None:
    """What would make the server fail to start, as one line (None: nothing): a user preset
    that cannot be served (`presets_dir`), an unknown warm preset or a device this machine lacks
    (`create_app` and the lifespan check them too)."""
    from posenc.api.app import app_presets, warm_list
    from posenc.presets import PresetError
    from posenc.runtime import DeviceError, resolve_device

    try:
        presets = app_presets(settings)
    except PresetError as err:
        return f"{flag_name('presets_dir')} (POSENC_PRESETS_DIR): {err}"
    try:
        warm_list(settings, list(presets))
    except ValueError as err:
        return f"{flag_name('warm_presets')} (POSENC_WARM_PRESETS): {err}"
    try:
        resolve_device(settings.device)
    except DeviceError as err:
        return f"{flag_name('device')} (POSENC_DEVICE): {err}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `posenc` console script: 0 after a clean stop, 2 for a configuration
    error, 3 when start-up failed otherwise."""
    args = build_parser().parse_args(argv)
    # settings first, the server (torch, the app) only once they are valid: a bad flag or
    # variable is answered in a fraction of a second, not after torch has been imported
    from posenc.api.settings import Settings, unknown_environment

    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if k != "command"}
    try:
        settings = Settings(**overrides)
    except ValidationError as err:
        print(f"posenc: configuration error: {describe_error(err)}", file=sys.stderr)
        return 2
    from posenc.api.server import configure_logging, serve

    problem = check_startup(settings)
    if problem is not None:
        print(f"posenc: configuration error: {problem}", file=sys.stderr)
        return 2
    configure_logging(settings)
    for warning in unknown_environment():
        log.warning("%s", warning)
    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
