"""`save_model` (what `posenc-client plug` writes with) applies `verify`'s external-data rule
(issue 32, finding 11): a location that is absolute or leaves the model's folder is refused before
anything is copied, so a model cannot make plug read a file beside it (`../../private/id_key`) or
write one outside the output folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from posenc_client.onnx import save_model


def _model_with_external(location: str) -> onnx.ModelProto:
    tensor = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    out = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])
    node = helper.make_node("Identity", ["w"], ["y"])
    graph = helper.make_graph([node], "g", [], [out], initializer=[tensor])
    return helper.make_model(graph)


@pytest.mark.parametrize("kind", ["parent", "absolute"])
def test_plug_never_copies_a_file_from_outside_the_model_folder(tmp_path: Path, kind: str) -> None:
    private = tmp_path / "private"
    private.mkdir()
    secret = private / "id_key"
    secret.write_bytes(b"secret" * 4)
    source = tmp_path / "models" / "m"
    source.mkdir(parents=True)
    location = "../../private/id_key" if kind == "parent" else str(secret)
    output = tmp_path / "out" / "sub" / "model.onnx"
    with pytest.raises(ValueError, match="leaves the folder"):
        save_model(_model_with_external(location), output, data_dir=source)
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert written == [Path("private/id_key")]


def test_a_location_inside_the_folder_is_kept(tmp_path: Path) -> None:
    source = tmp_path / "m"
    source.mkdir()
    (source / "w.data").write_bytes(bytes(16))
    output = tmp_path / "out" / "model.onnx"
    done = save_model(_model_with_external("w.data"), output, data_dir=source)
    assert (tmp_path / "out" / "w.data").read_bytes() == bytes(16)
    assert output.exists()
    assert done
