"""posenc-client: fetch exact position tables from a posenc server and plug them into runtimes.

    from posenc_client import Client

    with Client("http://127.0.0.1:8000") as client:
        tables = client.rope(128, 8192, rope_theta=500000.0, rope_type="llama3", factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=8192)
        cos, sin = tables["cos"], tables["sin"]          # numpy arrays

Depends on httpx and numpy (ml_dtypes for bfloat16) only. `posenc_client.onnx` (needs `onnx`)
plugs tables and subgraphs into ONNX models; `Tables.to_torch()` needs torch. Neither is imported
unless used. The exception tree is drawn in `posenc_client._exceptions`.
"""

from posenc_client._cache import DiskCache, default_cache_dir
from posenc_client._client import AsyncClient, Client
from posenc_client._core import Retries
from posenc_client._exceptions import (
    AmbiguousConfigError,
    APIError,
    AuthenticationError,
    BadRequestError,
    CacheMissError,
    ConnectError,
    CorruptCacheError,
    DecodeError,
    ExportError,
    FieldProblem,
    HubUnreachableError,
    IncompatibleModelError,
    InternalServerError,
    InvalidRowsError,
    InvalidSpecError,
    ModelIdError,
    ModelNotCachedError,
    NotFoundError,
    PosencError,
    RequestTimeoutError,
    ServiceUnavailableError,
    TooLargeError,
    TransportError,
    UnknownKindError,
    UnsupportedConfigError,
    UnsupportedExportError,
)
from posenc_client._formats import dump_safetensors, parse_safetensors
from posenc_client._onnx_model import OnnxModel
from posenc_client._results import (
    MRopePositions,
    Preset,
    PresetPart,
    ResolvedSpec,
    ResolvedSpecs,
    UnservedPart,
)
from posenc_client._tables import Tables
from posenc_client._version import __version__

__all__ = [
    "APIError",
    "AmbiguousConfigError",
    "AsyncClient",
    "AuthenticationError",
    "BadRequestError",
    "CacheMissError",
    "Client",
    "ConnectError",
    "CorruptCacheError",
    "DecodeError",
    "DiskCache",
    "ExportError",
    "FieldProblem",
    "HubUnreachableError",
    "IncompatibleModelError",
    "InternalServerError",
    "InvalidRowsError",
    "InvalidSpecError",
    "MRopePositions",
    "ModelIdError",
    "ModelNotCachedError",
    "NotFoundError",
    "OnnxModel",
    "PosencError",
    "Preset",
    "PresetPart",
    "RequestTimeoutError",
    "ResolvedSpec",
    "ResolvedSpecs",
    "Retries",
    "ServiceUnavailableError",
    "Tables",
    "TooLargeError",
    "TransportError",
    "UnknownKindError",
    "UnservedPart",
    "UnsupportedConfigError",
    "UnsupportedExportError",
    "__version__",
    "default_cache_dir",
    "dump_safetensors",
    "parse_safetensors",
]
