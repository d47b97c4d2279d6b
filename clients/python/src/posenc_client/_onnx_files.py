"""Reading and writing ONNX models whose weights live in external data files, without reading
the weights.

Exporters save real models as `model.onnx` (the graph, a few MB) plus `model.onnx.data` (the
weights, any size: protobuf caps one serialized message at 2 GB), each external tensor naming
its file, offset and length relative to the model's folder (onnx `external_data_helper`,
the "external data" section of the ONNX IR spec). The patchers only rewrite the graph and the
position tensors, so a model is loaded with `load_external_data=False` (memory: the graph), the
weights' files are kept as they are (hard-linked, else copied, beside an output written to
another folder: onnxruntime only reads data files inside the model's folder), and the tensors
posenc writes go to a data file of their own. Memory stays bounded by the position tables.

Needs `onnx`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import onnx

from posenc_check.graph import data_path, external_field, is_external

INLINE_LIMIT = 1024
"""Tensors of a model with external data that posenc writes are moved to its own data file
from this many bytes on (smaller ones stay inline, as the exporters keep theirs)."""

PROTO_LIMIT = (2 << 30) - (64 << 20)
"""A model without external data is written inline below this size (protobuf's 2 GB cap less a
margin for the graph), else its large tensors go to a data file."""


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every subgraph of its nodes' attributes (If branches, Loop bodies), depth
    first."""
    yield graph
    for node in graph.node:
        for item in node.attribute:
            if item.type == onnx.AttributeProto.GRAPH:
                yield from graphs(item.g)
            elif item.type == onnx.AttributeProto.GRAPHS:
                for sub in item.graphs:
                    yield from graphs(sub)


def tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor the model holds: initializers and `Constant`-style tensor attributes of the
    main graph and its subgraphs."""
    for graph in graphs(model.graph):
        yield from graph.initializer
        for node in graph.node:
            for item in node.attribute:
                if item.type == onnx.AttributeProto.TENSOR:
                    yield item.t
                elif item.type == onnx.AttributeProto.TENSORS:
                    yield from item.tensors


def external_locations(model: onnx.ModelProto) -> list[str]:
    """The data files the model's external tensors name (relative to its folder), sorted."""
    found = {external_field(t, "location") for t in tensors(model) if is_external(t)}
    return sorted(location for location in found if location)


def load_graph(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """The model at `path` without its external data (the weights stay on disk)."""
    return onnx.load(os.fspath(path), load_external_data=False)


def _copy_sparse(source: Path, target: Path) -> None:
    """Copy `source` to `target` in the kernel (`copy_file_range`: no bytes through this
    process, a reflink where the file system shares extents), data segments only (`SEEK_DATA`
    / `SEEK_HOLE`), so holes stay holes; falls back to `shutil.copyfile`."""
    size = source.stat().st_size
    with open(source, "rb") as src, open(target, "wb") as dst:
        try:
            offset = 0
            while offset < size:
                try:
                    start = os.lseek(src.fileno(), offset, os.SEEK_DATA)
                except OSError:  # ENXIO: only a hole is left
                    break
                end = os.lseek(src.fileno(), start, os.SEEK_HOLE)
                position = start
                while position < end:
                    copied = os.copy_file_range(
                        src.fileno(), dst.fileno(), end - position, position, position
                    )
                    if copied <= 0:
                        raise OSError("copy_file_range copied nothing")
                    position += copied
                offset = end
            dst.truncate(size)
        except (OSError, AttributeError):
            dst.seek(0)
            dst.truncate(0)
            src.seek(0)
            shutil.copyfileobj(src, dst, 1 << 24)


def _keep_data_file(source: Path, target: Path, link: bool) -> str:
    """Make `target` hold the bytes of `source` (a data file of the model): a copy (see
    `_copy_sparse`), or with `link` a hard link where the file system allows one (onnxruntime
    reads it; onnx's own loader refuses data files with several links as a possible "hardlink
    attack"); an existing `target` must already be that file. Returns what was done."""
    if target.exists():
        if source.exists() and os.path.samefile(source, target):
            return f"kept {target.name}"
        raise FileExistsError(
            f"{target} exists and is not the model's data file {source}: write the model to "
            "another folder or remove it"
        )
    if not source.exists():
        raise FileNotFoundError(f"the model's external data file {source} does not exist")
    target.parent.mkdir(parents=True, exist_ok=True)
    if link:
        try:
            os.link(source, target)
            return f"linked {target.name}"
        except OSError:
            pass
    _copy_sparse(source, target)
    return f"copied {target.name}"


def _externalize(model: onnx.ModelProto, folder: Path, name: str, limit: int) -> int:
    """Move every inline tensor of at least `limit` bytes into data file `folder/name`
    (64-byte aligned offsets, as onnx writes them); returns the bytes written."""
    written = 0
    moving = [
        t
        for t in tensors(model)
        if not is_external(t) and t.HasField("raw_data") and len(t.raw_data) >= limit
    ]
    if not moving:
        return 0
    with open(folder / name, "wb") as out:
        for tensor in moving:
            offset = -(-written // 64) * 64
            out.write(b"\0" * (offset - written))
            data = tensor.raw_data
            out.write(data)
            written = offset + len(data)
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            for key, value in (("location", name), ("offset", offset), ("length", len(data))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, str(value)
    return written


def save_model(
    model: onnx.ModelProto,
    path: str | os.PathLike[str],
    *,
    data_dir: str | os.PathLike[str] | None = None,
    link: bool = False,
) -> list[str]:
    """Write `model` to `path` without loading its external data.

    Args:
        model: a model, possibly loaded with `load_external_data=False` (as `posenc_client.onnx`
            loads paths), its external tensors relative to `data_dir`.
        path: the output `.onnx` file.
        data_dir: the folder the model's external data locations are relative to (the source
            model's folder); required when the model has external data.

    The external data files are kept: in place, never opened, when `path` is in `data_dir`;
    else copied into `path`'s folder under the same relative names (in the kernel, holes kept,
    memory bounded), or with `link=True` hard-linked (onnxruntime loads such a model; onnx's
    loader refuses a data file with several links). Tensors
    held inline of at least `INLINE_LIMIT` bytes (the position tables posenc wrote) go to
    `<stem>.posenc.data` beside `path` when the model has external data; a model without any is
    written inline below `PROTO_LIMIT`, else its large tensors go to `<name>.data`. Returns what
    was done to each data file, for reporting.
    """
    target = Path(path)
    folder = target.parent.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    done: list[str] = []
    locations = external_locations(model)
    if locations:
        if data_dir is None:
            raise ValueError(
                f"the model keeps tensors in external data files {locations}: give data_dir, "
                "the folder they are relative to (the source model's folder)"
            )
        source = Path(data_dir).resolve()
        for location in locations:
            # verify's rule: an absolute location, or one leaving the model's folder, is refused
            # before anything is copied (it would read, and write, files outside both folders)
            data_path(source, location)
            data_path(folder, location)
        for location in locations:
            if source != folder:
                done.append(_keep_data_file(source / location, folder / location, link))
        own, count = f"{target.stem}.posenc.data", 1
        while own in locations:  # a plugged model plugged again keeps its earlier file
            count += 1
            own = f"{target.stem}.posenc{count}.data"
        if _externalize(model, folder, own, INLINE_LIMIT):
            done.append(f"wrote {own}")
    elif model.ByteSize() > PROTO_LIMIT:
        own = f"{target.name}.data"
        _externalize(model, folder, own, INLINE_LIMIT)
        done.append(f"wrote {own}")
    target.write_bytes(model.SerializeToString())
    return done
