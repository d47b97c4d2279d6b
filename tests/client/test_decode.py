"""`Tables.from_safetensors` stays strict while it decodes faster: every malformed header is a
`DecodeError`, arrays are zero-copy views of the buffer, and a malformed `spec`/`meta` JSON text
fails loudly, in the client before anything is cached."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from posenc_client import Client, DecodeError, Tables, dump_safetensors, parse_safetensors

KEY = "cd" * 32
SPEC = {"kind": "rope", "head_dim": 4}
META = {"device": "cpu", "shapes": {"cos": [3, 2]}, "rotary_dim": 4}


def _file(spec: str = json.dumps(SPEC), meta: str | None = json.dumps(META)) -> bytes:
    metadata = {"key": KEY, "kind": "rope", "spec": spec}
    if meta is not None:
        metadata["meta"] = meta
    arrays = {"cos": np.arange(6, dtype=np.float32).reshape(3, 2), "n": np.arange(2)}
    return dump_safetensors(arrays, metadata)


def test_fields_decode_as_before() -> None:
    data = bytearray(_file())
    tables = Tables.from_safetensors(data, name="rope")
    assert (tables.key, tables.kind, tables.name, tables.notes) == (KEY, "rope", "rope", {})
    assert tables.spec == SPEC
    assert tables.meta == META
    assert tables.raw is data
    assert tables.etag == f'"{KEY}"'
    assert Tables.from_safetensors(_file(meta=None)).meta == {}
    copy = dataclasses.replace(tables, name="other")
    assert (copy.spec, copy.meta, copy.name) == (SPEC, META, "other")
    noted = tables.with_notes({"a": 1}, "x")
    assert (noted.spec, noted.notes, noted.name) == (SPEC, {"a": 1}, "x")
    with pytest.raises(AttributeError, match="nope"):
        tables.nope  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(dataclasses.FrozenInstanceError):
        tables.spec = {}  # type: ignore[misc]


def test_arrays_are_views_of_the_buffer() -> None:
    data = bytearray(_file())
    tables = Tables.from_safetensors(data)
    whole = np.frombuffer(data, dtype=np.uint8)
    for array in tables.values():
        assert np.shares_memory(array, whole)
    tables["cos"][0, 0] = 42.0
    assert Tables.from_safetensors(data)["cos"][0, 0] == 42.0
    assert not Tables.from_safetensors(bytes(data))["cos"].flags.writeable


@pytest.mark.parametrize(("spec", "meta"), [("{not json", json.dumps(META)), ("{}", "[1,")])
def test_malformed_spec_or_meta_is_a_decode_error(spec: str, meta: str) -> None:
    with pytest.raises(DecodeError, match="no posenc metadata"):
        Tables.from_safetensors(_file(spec, meta))


def _entry(**fields: Any) -> dict[str, Any]:
    return {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], **fields}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (_entry(dtype="F33"), "unsupported safetensors dtype"),
        (_entry(dtype=7), "unsupported safetensors dtype"),
        (_entry(shape=[-2]), "does not fit"),
        (_entry(shape=[3]), "does not fit"),
        (_entry(shape="ab"), "bad entry"),
        (_entry(shape=None), "bad entry"),
        (_entry(data_offsets=[0, 8, 9]), "bad entry"),
        (_entry(data_offsets=[4, 12]), "does not fit"),
        (_entry(data_offsets=[8, 0]), "does not fit"),
        ({"shape": [2], "data_offsets": [0, 8]}, "bad entry"),
        ("F32", "bad entry"),
    ],
)
def test_bad_tensor_entries(entry: Any, message: str) -> None:
    text = json.dumps({"__metadata__": {"key": KEY}, "x": entry}).encode()
    data = len(text).to_bytes(8, "little") + text + bytes(8)
    with pytest.raises(DecodeError, match=message):
        parse_safetensors(data)


def test_metadata_values_are_strings() -> None:
    text = json.dumps({"__metadata__": {"a": 1, "b": "c"}}).encode()
    assert parse_safetensors(len(text).to_bytes(8, "little") + text)[1] == {"a": "1", "b": "c"}
    bad = json.dumps({"__metadata__": [1]}).encode()
    with pytest.raises(DecodeError, match="__metadata__"):
        parse_safetensors(len(bad).to_bytes(8, "little") + bad)


def test_client_ignores_a_cache_entry_with_malformed_meta(pclient: Client, cache_dir: Path) -> None:
    t = pclient.alibi(3)
    path = cache_dir / "tables" / f"{t.key}.safetensors"
    arrays, metadata = parse_safetensors(path.read_bytes())
    path.write_bytes(dump_safetensors(arrays, {**metadata, "meta": "{broken"}))
    again = pclient.alibi(3)  # the entry is ignored and fetched anew, not returned broken
    assert again.meta["shapes"] == t.meta["shapes"]
    assert Tables.from_safetensors(path.read_bytes()).meta == t.meta
