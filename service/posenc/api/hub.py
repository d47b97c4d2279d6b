"""Hugging Face model ids on the server: `{"model_id": "ORG/NAME[@REVISION]"}` in `/v1/resolve`
(the explorer's model-id field) -> the model's config.json, through huggingface_hub (the optional
`posenc[hub]` extra) and the server's own Hugging Face cache.

huggingface_hub reads its environment itself: `HF_HUB_CACHE` (else `$HF_HOME/hub`, else
`~/.cache/huggingface/hub`) is the cache, `HF_HUB_OFFLINE=1` keeps the server to it
(`try_to_load_from_cache`), `HF_TOKEN` opens gated repositories. Online, `hf_hub_download`
fetches `config.json` at the revision (`main` when absent) and answers from the cache when the Hub
cannot be reached: at once where one connection attempt says it cannot be (refused, no route, name
unknown: `hub_refuses`), else after huggingface_hub's own retries (~23 s). Nothing else of the
repository is read. The Python client resolves ids on the user's machine instead
(`posenc_client._hub`, the same id syntax and offline rules) and sends the config, so a server
needs huggingface_hub only for clients that send `model_id` (the explorer, plain HTTP).

Errors (`error_types.MODEL_ID`): 422 `invalid_model_id` (not `ORG/NAME[@REVISION]`, or beside
`hf_config`), 404 `unknown_model` (no repository, revision or config.json; gated), 404
`model_not_cached` (offline, not in the cache), 501 `hub_not_installed`, 502 `hub_unreachable`.
"""

from __future__ import annotations

import asyncio
import errno
import json
import re
import socket
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc.api.error_types import (
    HUB_NOT_INSTALLED,
    HUB_UNREACHABLE,
    INVALID_MODEL_ID,
    MODEL_NOT_CACHED,
    UNKNOWN_MODEL,
    ErrorType,
)
from posenc.api.errors import ApiError

MODEL_ID = re.compile(
    r"(?P<repo_id>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+)(?:@(?P<revision>[A-Za-z0-9._/-]+))?"
)
"""`ORG/NAME[@REVISION]`, as the client parses it (`posenc_client._hub.MODEL_ID`): the Hub's
repository names (letters, digits, `.`, `_`, `-`; no `..` or `--`), one `/`; a revision of the
same characters and `/` (`refs/pr/1`)."""

FIELD = "model_id"


@dataclass(frozen=True)
class ModelConfig:
    """A model id's config.json: the id as given, the commit it was read at (the snapshot's
    folder name in the cache) and the parsed config."""

    model_id: str
    commit: str
    config: dict[str, Any]


def _invalid(message: str, value: Any) -> ApiError:
    problem = {"field": FIELD, "message": message, "value": value}
    return ApiError(INVALID_MODEL_ID, f"invalid model_id: {message}", [problem])


def parse_model_id(value: Any) -> tuple[str, str | None]:
    """`ORG/NAME[@REVISION]` -> (repo_id, revision or None); raises 422 `invalid_model_id`."""
    if not isinstance(value, str):
        raise _invalid("must be a string ORG/NAME[@REVISION]", type(value).__name__)
    found = MODEL_ID.fullmatch(value)
    repo_id = found["repo_id"] if found else ""
    if not found or ".." in repo_id or "--" in repo_id or repo_id.endswith((".", "-")):
        raise _invalid(
            "expected ORG/NAME[@REVISION] (a Hugging Face repository, e.g. "
            "meta-llama/Llama-3.1-8B or Qwen/Qwen2.5-7B@main)",
            value[:120],
        )
    return repo_id, found["revision"]


def _error(error: ErrorType, model_id: str, message: str) -> ApiError:
    detail = [{"field": FIELD, "message": message, "value": model_id}]
    return ApiError(error, f"model {model_id}: {message}", detail)


def hub_refuses(endpoint: str) -> str | None:
    """Why the Hub at `endpoint` cannot be reached at all, from one connection attempt: the
    connection refused, no route to its host, or its name unknown; None otherwise (it accepts
    connections, it is slow to, or a proxy stands between: huggingface_hub's own requests and
    retries decide). huggingface_hub retries such a failure 5 times, backing off 1 to 8 s (~23 s
    in all), before it answers from the cache; where the Hub cannot answer, the cache's answer
    (`local_files_only`) is the same, at once."""
    parts = urllib.parse.urlsplit(endpoint)
    host = parts.hostname
    if not host or parts.scheme not in ("http", "https"):
        return None
    proxies = urllib.request.getproxies()
    if (parts.scheme in proxies or "all" in proxies) and not urllib.request.proxy_bypass(host):
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=5):
            return None
    except ConnectionRefusedError:
        return f"connection to {host}:{port} refused"
    except socket.gaierror as err:
        return f"host {host} unknown ({err.strerror})"
    except OSError as err:
        if err.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return f"no route to {host}:{port}"
        return None


def _config_path(model_id: str, repo_id: str, revision: str | None) -> str:
    """The cached (or, online, downloaded) config.json of the repository; raises `ApiError`."""
    try:
        from huggingface_hub import constants, errors, hf_hub_download, try_to_load_from_cache
    except ImportError:
        raise _error(
            HUB_NOT_INSTALLED,
            model_id,
            "this server resolves no model ids: install huggingface_hub (pip install "
            "'posenc[hub]'), or send the config.json as hf_config",
        ) from None
    cache = str(constants.HF_HUB_CACHE)
    if constants.HF_HUB_OFFLINE:
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache, revision=revision)
        if not isinstance(found, str):
            raise _error(
                MODEL_NOT_CACHED,
                model_id,
                f"the server is offline (HF_HUB_OFFLINE) and its Hugging Face cache {cache} has "
                "no config.json for it: send the config.json as hf_config",
            )
        return found
    refused = hub_refuses(constants.ENDPOINT)
    try:
        return str(
            hf_hub_download(
                repo_id,
                "config.json",
                revision=revision,
                cache_dir=cache,
                local_files_only=refused is not None,
            )
        )
    except errors.GatedRepoError:
        message = "the repository is gated and this server has no access to it"
    except errors.RepositoryNotFoundError:
        message = "no such repository on the Hugging Face Hub (or it is private)"
    except errors.RevisionNotFoundError:
        message = f"no revision {revision!r} in {repo_id}"
    except errors.RemoteEntryNotFoundError:
        message = "the repository has no config.json"
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled):
        raise _error(
            HUB_UNREACHABLE,
            model_id,
            f"the Hugging Face Hub cannot be reached{f' ({refused})' if refused else ''} and the "
            f"cache {cache} lacks its config.json",
        ) from None
    except errors.HfHubHTTPError as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        message = f"the Hugging Face Hub refused: {first}"
    raise _error(UNKNOWN_MODEL, model_id, message)


def _read(model_id: str) -> ModelConfig:
    repo_id, revision = parse_model_id(model_id)
    path = Path(_config_path(model_id, repo_id, revision))
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise _error(UNKNOWN_MODEL, model_id, f"its config.json cannot be read: {err}") from None
    if not isinstance(config, dict):
        raise _error(UNKNOWN_MODEL, model_id, "its config.json is not a JSON object")
    # the cache's layout: models--ORG--NAME/snapshots/<commit>/config.json
    return ModelConfig(model_id, path.parent.name, config)


async def model_config(model_id: Any) -> ModelConfig:
    """The config.json of `model_id` (`ORG/NAME[@REVISION]`), read in a worker thread (the Hub
    may be slow); raises `ApiError` (`error_types.MODEL_ID`)."""
    parse_model_id(model_id)  # a malformed id answers before any thread starts
    return await asyncio.to_thread(_read, model_id)


async def with_model_config(body: dict[str, Any]) -> tuple[dict[str, Any], ModelConfig | None]:
    """A request body naming `model_id` -> the body with the model's config.json as
    `hf_config` in its place, and the model read; any other body as it is, and None."""
    if FIELD not in body:
        return body, None
    if "hf_config" in body:
        raise _invalid("give model_id or hf_config, not both", body[FIELD])
    model = await model_config(body[FIELD])
    rest = {k: v for k, v in body.items() if k != FIELD}
    return {"hf_config": model.config, **rest}, model
