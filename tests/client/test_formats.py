"""The client's own safetensors reader/writer against the safetensors package, file outputs, and
the ONNX metadata reader against onnx's parser."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from posenc_client import DecodeError, Tables, dump_safetensors, parse_safetensors
from posenc_client._formats import write_atomic
from posenc_client._onnx_model import onnx_metadata

TORCH_TENSORS = {
    "f32": torch.randn(3, 5),
    "f64": torch.randn(2).double(),
    "f16": torch.randn(4, 2).half(),
    "bf16": torch.randn(6, 3).bfloat16(),
    "i64": torch.arange(7),
    "i32": torch.arange(3, dtype=torch.int32),
    "u8": torch.arange(4, dtype=torch.uint8),
    "bool": torch.tensor([True, False]),
    "scalar": torch.tensor(1.5),
    "empty": torch.zeros(0, 4),
}


def _numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def test_reads_what_safetensors_writes() -> None:
    data = st_save(TORCH_TENSORS, metadata={"key": "k", "spec": "{}"})
    arrays, metadata = parse_safetensors(data)
    assert metadata == {"key": "k", "spec": "{}"}
    for name, tensor in TORCH_TENSORS.items():
        assert arrays[name].dtype == _numpy(tensor).dtype, name
        assert arrays[name].shape == tuple(tensor.shape), name
        assert arrays[name].tobytes() == _numpy(tensor).tobytes(), name
    writable, _ = parse_safetensors(bytearray(data))
    writable["f32"][0, 0] = 0.0


def test_safetensors_reads_what_we_write() -> None:
    arrays = {n: _numpy(t) for n, t in TORCH_TENSORS.items()}
    arrays["f8"] = np.array([1.0, -2.0], dtype=ml_dtypes.float8_e4m3fn)
    data = dump_safetensors(arrays, {"a": "b"})
    loaded = st_load(data)
    for name, tensor in TORCH_TENSORS.items():
        assert torch.equal(loaded[name], tensor), name
    back, meta = parse_safetensors(data)
    assert meta == {"a": "b"}
    assert back["f8"].tobytes() == arrays["f8"].tobytes()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x01", "shorter than"),
        ((10**9).to_bytes(8, "little") + b"{}", "exceeds"),
        ((2).to_bytes(8, "little") + b"[]", "not a JSON object"),
        ((4).to_bytes(8, "little") + b"{xx}", "not JSON"),
        (dump_safetensors({"x": np.zeros(4, np.float32)}, None)[:-1], "does not fit"),
    ],
)
def test_malformed_files_are_decode_errors(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        parse_safetensors(data)


def test_tables_save(tmp_path: Path) -> None:
    arrays = {"cos": np.ones((4, 2), np.float32), "inv_freq": np.ones(2, np.float32)}
    raw = dump_safetensors(arrays, {"key": "0" * 64, "kind": "rope", "spec": '{"kind":"rope"}'})
    tables = Tables.from_safetensors(raw)
    tables.save(tmp_path / "t.safetensors")
    assert (tmp_path / "t.safetensors").read_bytes() == raw
    tables.save(tmp_path / "t.npz")
    with np.load(tmp_path / "t.npz") as npz:
        assert set(npz.files) == {"cos", "inv_freq"}
    tables.save(tmp_path / "cos.npy", tensor="cos")
    assert np.load(tmp_path / "cos.npy").shape == (4, 2)
    tables.save(tmp_path / "cos.safetensors", tensor="cos")
    assert list(parse_safetensors((tmp_path / "cos.safetensors").read_bytes())[0]) == ["cos"]
    with pytest.raises(ValueError, match="one tensor"):
        tables.save(tmp_path / "t.npy")
    with pytest.raises(ValueError, match="suffix"):
        tables.save(tmp_path / "t.txt")
    bf16 = Tables.from_safetensors(
        dump_safetensors({"cos": np.ones(2, ml_dtypes.bfloat16)}, {"key": "k", "kind": "rope",
                                                                     "spec": "{}"})
    )  # fmt: skip
    with pytest.raises(ValueError, match="bfloat16"):
        bf16.save(tmp_path / "b.npz")
    with pytest.raises(DecodeError, match="no posenc metadata"):
        Tables.from_safetensors(dump_safetensors(arrays, None))


def test_onnx_metadata_matches_onnx() -> None:
    graph = onnx.helper.make_graph([], "g", [], [])
    model = onnx.helper.make_model(graph, doc_string="x" * 300)
    onnx.helper.set_model_props(
        model, {"posenc.graph": "alibi/bias", "posenc.spec": '{"a": "é"}', "other": "1"}
    )
    assert onnx_metadata(model.SerializeToString()) == {"graph": "alibi/bias", "spec": '{"a": "é"}'}
    with pytest.raises(DecodeError):
        onnx_metadata(b"\x72\xff\xff\xff")


def test_etags_name_the_device_of_the_bytes() -> None:
    from posenc_client._core import Reply, reply_key

    key = "ab" * 32
    arrays = {"x": np.zeros(2, np.float32)}
    assert Tables(key, "rope", {}, {"device": "cpu"}, arrays).etag == f'"{key}"'
    assert Tables(key, "rope", {}, {}, arrays).etag == f'"{key}"'
    assert Tables(key, "rope", {}, {"device": "cuda:0"}, arrays).etag == f'"{key}@cuda:0"'
    for tag in (f'"{key}"', f'"{key}@cuda:0"', f'W/"{key}.raw.cos@cuda:1"'):
        reply = Reply(200, httpx.Headers({"etag": tag}), bytearray())
        assert reply_key(reply) == key


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_files_take_the_umask(tmp_path: Path, umask: int) -> None:
    """`fetch -o`, `save`, the cache: 0o666 less the umask, as `open(path, "w")` gives (they were
    0o600 whatever the umask, from `tempfile.mkstemp`), the temporary file created exclusively."""
    was = os.umask(umask)
    try:
        write_atomic(tmp_path / "table.safetensors", b"data")
    finally:
        os.umask(was)
    assert stat.S_IMODE((tmp_path / "table.safetensors").stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["table.safetensors"]
