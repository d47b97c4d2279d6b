"""Hugging Face model ids (`ORG/NAME[@REVISION]`) -> the model's config.json, through
huggingface_hub (the optional `posenc-client[hub]` extra), as transformers' `from_pretrained`
finds it.

Where a config is accepted (`Client.resolve`, `Client.tables_for_model`, `--hf-config`), a string
that names an existing file or folder is read from disk, as `from_pretrained` prefers an existing
local directory; any other string of the form `ORG/NAME[@REVISION]` is a model id. Its
config.json comes from huggingface_hub's cache (`HF_HUB_CACHE`, else `$HF_HOME/hub`, else
`~/.cache/huggingface/hub`):

- offline (the client's `offline`/`POSENC_OFFLINE`, or `HF_HUB_OFFLINE=1`): the cache only
  (`try_to_load_from_cache`), `ModelNotCachedError` naming the id and the cache when it lacks it;
- online: `hf_hub_download(repo_id, "config.json", revision=...)`, which answers from the cache
  when the revision's file is there and the Hub cannot be reached, and uses the user's token
  (`HF_TOKEN`, `hf auth login`) for gated repositories. Where one connection attempt shows the
  Hub cannot be reached (refused, no route, name unknown: `hub_refuses`) the cache answers at
  once, not after huggingface_hub's retries (~23 s).

`REVISION` is a branch, a tag or a commit hash (`main` when absent). Every failure is a
`ModelIdError` with a one-line message naming the id.
"""

from __future__ import annotations

import errno
import re
import socket
import urllib.parse
import urllib.request
from dataclasses import dataclass

from posenc_client._exceptions import HubUnreachableError, ModelIdError, ModelNotCachedError

MODEL_ID = re.compile(
    r"(?P<repo_id>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+)(?:@(?P<revision>[A-Za-z0-9._/-]+))?"
)
"""`ORG/NAME[@REVISION]`: the Hub's repository names (letters, digits, `.`, `_`, `-`), one `/`;
a revision of the same characters and `/` (`refs/pr/1`)."""

INSTALL_HINT = "pip install 'posenc-client[hub]'"


@dataclass(frozen=True)
class ModelId:
    """A parsed model id: the Hub repository and the revision (None: `main`)."""

    repo_id: str
    revision: str | None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_model_id(text: str) -> ModelId | None:
    """`ORG/NAME[@REVISION]` -> its `ModelId`; None for any other string (`..` and `--` in a
    name, which the Hub refuses, included)."""
    found = MODEL_ID.fullmatch(text)
    if found is None:
        return None
    repo_id = found["repo_id"]
    if ".." in repo_id or "--" in repo_id or repo_id.endswith((".", "-")):
        return None
    return ModelId(repo_id, found["revision"])


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


def hub_config_path(model_id: ModelId, *, offline: bool) -> str:
    """The local path of `model_id`'s config.json (downloaded into the Hub cache when online);
    called for a name that is no local file or folder. Raises `ModelIdError`
    (`ModelNotCachedError`, `HubUnreachableError`)."""
    try:
        from huggingface_hub import constants, errors, hf_hub_download, try_to_load_from_cache
    except ImportError:
        raise ModelIdError(
            f"model {model_id}: model ids need huggingface_hub: {INSTALL_HINT}",
            model_id=str(model_id),
        ) from None
    cache = str(constants.HF_HUB_CACHE)
    if offline or constants.HF_HUB_OFFLINE:
        why = "the client is offline" if offline else "HF_HUB_OFFLINE is set"
        found = try_to_load_from_cache(
            model_id.repo_id, "config.json", cache_dir=cache, revision=model_id.revision
        )
        if not isinstance(found, str):
            raise ModelNotCachedError(
                f"model {model_id}: no config.json in the Hugging Face cache {cache} and {why} "
                f"(fetch it once online, or `hf download {model_id.repo_id} config.json`; "
                "no file or folder of that name here either)",
                model_id=str(model_id),
            )
        return found
    refused = hub_refuses(constants.ENDPOINT)
    try:
        return str(
            hf_hub_download(
                model_id.repo_id,
                "config.json",
                revision=model_id.revision,
                cache_dir=cache,
                local_files_only=refused is not None,
            )
        )
    except errors.GatedRepoError:
        message = "is gated: accept its terms on huggingface.co and log in (HF_TOKEN)"
    except errors.RepositoryNotFoundError:
        message = (
            "no such repository on the Hub (or it is private: log in with HF_TOKEN), "
            "and no file or folder of that name here"
        )
    except errors.RevisionNotFoundError:
        message = f"no revision {model_id.revision!r} in {model_id.repo_id}"
    except errors.RemoteEntryNotFoundError:
        message = "the repository has no config.json"
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled) as err:
        raise HubUnreachableError(
            f"model {model_id}: the Hub cannot be reached and the cache {cache} lacks its "
            f"config.json ({refused or _first_line(err)})",
            model_id=str(model_id),
        ) from None
    except errors.HfHubHTTPError as err:
        message = f"the Hub refused: {_first_line(err)}"
    raise ModelIdError(f"model {model_id}: {message}", model_id=str(model_id))


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
