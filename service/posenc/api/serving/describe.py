"""A canonical spec as the catalog shows it (presets, `/v1/resolve`), its `url` the form any
replica answers (`posenc.api.tableurl`: `/v1/tables/{key}.{spec}`)."""

from __future__ import annotations

from typing import Any

from posenc.api.tableurl import table_url
from posenc.encodings import SpecBase, canonical_dict, content_key


def describe_spec(spec: SpecBase, key: str | None = None) -> dict[str, Any]:
    """A canonical spec as the catalog shows it: kind, key, table URL, spec, outputs, bytes."""
    key = key or content_key(spec)
    return {
        "kind": spec.kind,
        "key": key,
        "url": table_url(spec, key),
        "spec": canonical_dict(spec),
        "outputs": {
            name: {"shape": list(info.shape), "dtype": info.dtype}
            for name, info in spec.outputs().items()
        },
        "bytes": spec.output_bytes(),
    }
