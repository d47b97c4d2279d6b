"""What real exporters emit, plugged: models with external data (weights never read), and
LongRoPE's two caches chosen by an `If` on the length (onnxruntime-genai's builder), both
branches filled, each side equal to transformers' Phi-3.5 attention.

The external-data models are saved by onnx itself (`save_as_external_data`, every initializer
external, size threshold 0, as the builder saves), so that the position caches and the weight
live in `model.onnx.data`; inotify shows that plugging never opens that file. Speed and memory
at real size: bench/plug.py.
"""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from posenc_client import Client, IncompatibleModelError, Tables
from posenc_client.onnx import attach_rope_caches, save_model, verify_rope_caches
from tests.client import blocks

PHI = "microsoft__Phi-3.5-mini-instruct"
HEADS, KV_HEADS = 4, 2
SHORT_ROWS, LONG_ROWS, SWITCH = 4096, 4200, 4096
ATTENTION_ATOL = 1e-5  # as test_e2e_plug: onnxruntime and torch reduce the matmuls differently


class FileWatch:
    """Opens and reads of one file as the kernel reports them (inotify, through libc): it sees
    every reader, onnx's C++ external-data loader and onnxruntime included, not only Python's
    own `open`."""

    IN_ACCESS, IN_OPEN, IN_NONBLOCK = 0x1, 0x20, 0o4000

    def __init__(self, path: Path) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(self.IN_NONBLOCK)
        assert self.fd >= 0
        mask = self.IN_ACCESS | self.IN_OPEN
        assert self.libc.inotify_add_watch(self.fd, os.fsencode(path), mask) >= 0

    def events(self) -> int:
        """How many opens and reads happened since the last call."""
        count = 0
        while True:
            try:
                data = os.read(self.fd, 4096)
            except BlockingIOError:
                return count
            offset = 0
            while offset < len(data):  # struct inotify_event: wd, mask, cookie, len, name
                _, _, _, size = struct.unpack_from("iIII", data, offset)
                offset += 16 + size
                count += 1

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture(scope="module")
def phi_tables(shared_client: Client) -> tuple[Tables, Tables]:
    """Phi-3.5's ort_gqa tables on each side of its switch: short factors (seq_len 4096, 4096
    rows) and long factors (seq_len 4097, 4200 rows)."""
    path = blocks.CONFIGS / f"{PHI}.json"
    short = shared_client.tables_for_model(
        path, profile="ort_gqa", max_positions=SHORT_ROWS, seq_len=SWITCH
    )["rope"]
    long = shared_client.tables_for_model(
        path, profile="ort_gqa", max_positions=LONG_ROWS, seq_len=SWITCH + 1
    )["rope"]
    return short, long


def _model() -> onnx.ModelProto:
    hd = blocks.head_dim(blocks.load_config(PHI))
    return blocks.switch_block(
        hd, HEADS, KV_HEADS, short_rows=SHORT_ROWS, long_rows=LONG_ROWS, threshold=SWITCH
    )


def _save_external(model: onnx.ModelProto, folder: Path) -> Path:
    """`model` saved in `folder` with every initializer in `model.onnx.data` (onnx moves the
    tensors of the proto it saves: a copy is saved)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.save(
        copy,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    return path


def _feeds(past: int, new: int, hd: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(past)
    return {
        "query": rng.standard_normal((1, new, HEADS * hd), np.float32),
        "key": rng.standard_normal((1, new, KV_HEADS * hd), np.float32),
        "value": rng.standard_normal((1, new, KV_HEADS * hd), np.float32),
        "past_key": rng.standard_normal((1, KV_HEADS, past, hd), np.float32),
        "past_value": rng.standard_normal((1, KV_HEADS, past, hd), np.float32),
        "seqlens_k": np.array([past + new - 1], np.int32),
        "total_sequence_length": np.array(past + new, np.int32),
    }


def _run(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


@pytest.mark.parametrize(("past", "new"), [(4088, 8), (4093, 8)], ids=["short", "long"])
def test_length_switch_both_branches_equal_transformers(
    phi_tables: tuple[Tables, Tables], past: int, new: int
) -> None:
    """Total length 4096 takes the else branch (short factors), 4101 the then branch (long
    factors); each equals transformers' Phi-3 rotary and attention at those positions."""
    short, long = phi_tables
    config = blocks.load_config(PHI)
    hd = blocks.head_dim(config)
    model = attach_rope_caches(_model(), short, long_tables=long)
    assert {i.name for i in model.graph.initializer}.isdisjoint({"cos", "sin"})
    feeds = _feeds(past, new, hd)
    out = _run(model, feeds)[0]
    expected = blocks.gqa_reference(config, feeds, HEADS, KV_HEADS)
    torch.testing.assert_close(torch.from_numpy(out), expected["out"], atol=ATTENTION_ATOL, rtol=0)
    tables = dict((p.key, p.value) for p in model.metadata_props if p.key == "posenc.tables")[
        "posenc.tables"
    ]
    assert f"{short.key} if length <= {SWITCH} else {long.key}" in tables


def test_length_switch_refusals(phi_tables: tuple[Tables, Tables]) -> None:
    """Without the long table, with the sides swapped, or with a condition that is not a length
    bound, the refusal names the If node; a long table for a model without a switch is refused."""
    short, long = phi_tables
    with pytest.raises(IncompatibleModelError, match=r"rope_caches_subgraph/If.*long_tables"):
        attach_rope_caches(_model(), short)
    with pytest.raises(IncompatibleModelError, match="short table was computed for seq_len 4097"):
        attach_rope_caches(_model(), long, long_tables=short)
    unreadable = _model()
    greater = next(n for n in unreadable.graph.node if n.op_type == "Greater")
    greater.input[1] = "length"
    with pytest.raises(IncompatibleModelError, match="If node '/model/rope_caches_subgraph/If'"):
        attach_rope_caches(unreadable, short, long_tables=long)
    with pytest.raises(IncompatibleModelError, match="no cache is chosen by a length If"):
        attach_rope_caches(blocks.gqa_block(96, HEADS, KV_HEADS), short, long_tables=long)


@pytest.mark.parametrize("caches", ["initializers", "length switch"])
@pytest.mark.parametrize("where", ["same folder", "linked", "copied"])
def test_external_data_never_read(
    phi_tables: tuple[Tables, Tables], tmp_path: Path, where: str, caches: str
) -> None:
    """A model saved with every initializer external (the caches too, or LongRoPE's If) plugs
    without the kernel seeing its data file opened (written beside it, or into another folder
    with the data hard-linked); copied into another folder, only the copy reads it. The new
    caches go to a data file of their own, and onnxruntime loading the output from disk gives
    exactly what the same model plugged inline gives."""
    short, long = phi_tables
    hd = blocks.head_dim(blocks.load_config(PHI))
    if caches == "initializers":
        model = blocks.with_weight(
            blocks.gqa_block(hd, HEADS, KV_HEADS, caches="initializer"), HEADS * hd
        )
        long_tables = None
        cases = [(4088, 8)]
    else:
        model, long_tables, cases = _model(), long, [(4088, 8), (4093, 8)]
    source = _save_external(model, tmp_path / "exported")
    data = source.with_name("model.onnx.data")
    assert [t.name for t in onnx.load(source, load_external_data=False).graph.initializer if
            t.data_location == onnx.TensorProto.EXTERNAL]  # fmt: skip
    output = (tmp_path / "plugged" if where != "same folder" else source.parent) / "out.onnx"
    watch = FileWatch(data)
    try:
        patched = attach_rope_caches(source, short, long_tables=long_tables)
        assert watch.events() == 0
        done = save_model(patched, output, data_dir=source.parent, link=where == "linked")
        kept = output.with_name("model.onnx.data")
        if where == "copied":
            assert watch.events() > 0
            assert not os.path.samefile(kept, data)
            assert kept.read_bytes() == data.read_bytes()
        else:
            assert watch.events() == 0
            assert os.path.samefile(kept, data)
        assert done[-1] == "wrote out.posenc.data"
        assert output.stat().st_size < 10_000  # the graph only: every table is in a data file
        reference = attach_rope_caches(model, short, long_tables=long_tables)
        for past, new in cases:
            feeds = _feeds(past, new, hd)
            for got, expected in zip(_run(output, feeds), _run(reference, feeds), strict=True):
                np.testing.assert_array_equal(got, expected)
        assert watch.events() > 0  # the watch works: onnxruntime read the weights
    finally:
        watch.close()


def test_external_data_needs_its_folder(phi_tables: tuple[Tables, Tables], tmp_path: Path) -> None:
    """Saving a model with external data without naming the folder its data is relative to is
    refused, and so is an output folder holding another file under the data file's name."""
    short, long = phi_tables
    source = _save_external(_model(), tmp_path / "exported")
    patched = attach_rope_caches(source, short, long_tables=long)
    with pytest.raises(ValueError, match="give data_dir"):
        save_model(patched, tmp_path / "out" / "out.onnx")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "model.onnx.data").write_bytes(b"other")
    with pytest.raises(FileExistsError, match="not the model's data file"):
        save_model(patched, tmp_path / "taken" / "out.onnx", data_dir=source.parent)


def test_verify_reads_only_the_caches_even_hard_linked(
    phi_tables: tuple[Tables, Tables], tmp_path: Path
) -> None:
    """verify reads the caches' own bytes from external data, also from a data file with
    several hard links (as `link=True` leaves the source's; onnx's loader refuses those)."""
    short, _ = phi_tables
    hd = blocks.head_dim(blocks.load_config(PHI))
    plugged = attach_rope_caches(blocks.gqa_block(hd, HEADS, KV_HEADS), short)
    source = _save_external(blocks.with_weight(plugged, HEADS * hd), tmp_path / "exported")
    os.link(source.with_name("model.onnx.data"), tmp_path / "second-link.data")
    reports = verify_rope_caches(source, short)
    assert [(r.name, r.verdict) for r in reports] == [("cos", "exact"), ("sin", "exact")]
