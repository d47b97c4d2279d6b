"""`posenc-client plug` on a model with more than 2 GB of external data: time and peak memory.

    python -m bench.plug [--gib 2.5] [--rows 131072] [--keep DIR]

Builds a Llama-3.1-shaped model as onnxruntime-genai's builder saves one: `model.onnx` (the
graph) + `model.onnx.data` (every initializer, size threshold 0): a GroupQueryAttention
(do_rotary=1, 32 heads of 128, 8 KV heads) reading `cos_cache` / `sin_cache` [rows, 64] from the
data file, then a chain of [4096, 4096] float32 MatMul weights adding up to `--gib` GiB. The data
file is sparse (a hole, `truncate`) but for the caches, which hold the default RoPE (what an
exporter dropping Llama 3.1's llama3 scaling bakes: plug's report diagnoses it); it is made in
about a second and takes 64 MiB of disk. The plug never reads the weights, which is the point
(the model is never run). Then `posenc serve` is started on a free port and
`posenc-client plug model.onnx --hf-config <Llama 3.1 config> -o out/plugged.onnx` runs as a
child process: wall time and its peak RSS (`ru_maxrss` of the waited child) are reported, with
the output folder's files (the weights' file copied in the kernel, holes kept; the new caches in
`plugged.posenc.data`). The table fetch is included (the server computes the caches once).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto
from onnx import helper as h

from bench._common import header, load, mib, table
from bench.serve import free_port
from bench.startup import status

CONFIG = Path(__file__).resolve().parent.parent / "tests/data/configs/meta-llama__Llama-3.1-8B.json"
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
HIDDEN = HEADS * HEAD_DIM


def _external(name: str, dims: list[int], offset: int) -> tuple[TensorProto, int]:
    """A float32 initializer stored in model.onnx.data at `offset`; the next offset."""
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
    length = 4
    for dim in dims:
        length *= dim
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "model.onnx.data"), ("offset", offset), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
    return tensor, offset + -(-length // 4096) * 4096


def build(folder: Path, gib: float, rows: int) -> int:
    """Write the model into `folder`; returns the data file's size in bytes."""
    inits: list[TensorProto] = []
    offset = 0
    starts = []
    for name in ("cos_cache", "sin_cache"):
        starts.append(offset)
        tensor, offset = _external(name, [rows, HEAD_DIM // 2], offset)
        inits.append(tensor)
    layers = max(1, int(gib * (1 << 30) / (HIDDEN * HIDDEN * 4)) + 1)
    t = TensorProto.FLOAT
    inputs = [
        h.make_tensor_value_info("query", t, [1, "S", HIDDEN]),
        h.make_tensor_value_info("key", t, [1, "S", KV_HEADS * HEAD_DIM]),
        h.make_tensor_value_info("value", t, [1, "S", KV_HEADS * HEAD_DIM]),
        h.make_tensor_value_info("past_key", t, [1, KV_HEADS, "past", HEAD_DIM]),
        h.make_tensor_value_info("past_value", t, [1, KV_HEADS, "past", HEAD_DIM]),
        h.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        h.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
    ]
    nodes = [
        h.make_node(
            "GroupQueryAttention",
            [i.name for i in inputs] + ["cos_cache", "sin_cache"],
            ["h0", "present_key", "present_value"],
            name="/model/layers.0/attn/GroupQueryAttention",
            domain="com.microsoft",
            num_heads=HEADS,
            kv_num_heads=KV_HEADS,
            do_rotary=1,
        )
    ]
    for layer in range(layers):
        tensor, offset = _external(f"w{layer}", [HIDDEN, HIDDEN], offset)
        inits.append(tensor)
        nodes.append(h.make_node("MatMul", [f"h{layer}", f"w{layer}"], [f"h{layer + 1}"]))
    outputs = [h.make_tensor_value_info(f"h{layers}", t, [1, "S", HIDDEN])]
    graph = h.make_graph(nodes, "big", inputs, outputs, initializer=inits)
    imports = [h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]
    model = h.make_model(graph, opset_imports=imports, ir_version=10)
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    # the caches an exporter that drops Llama 3.1's llama3 scaling would bake (default RoPE,
    # theta 500000), so that plug's verify diagnoses them; the weights stay a hole
    inv = 500000.0 ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    angles = np.arange(rows)[:, None] * inv[None, :]
    with open(folder / "model.onnx.data", "wb") as data:
        data.truncate(offset)
        for start, values in zip(starts, (np.cos(angles), np.sin(angles)), strict=True):
            data.seek(start)
            data.write(values.astype(np.float32).tobytes())
    return offset


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=2.5, help="weights in GiB (default 2.5)")
    parser.add_argument("--rows", type=int, default=131072, help="cache rows (default 131072)")
    parser.add_argument("--keep", type=Path, help="build in this folder and keep it")
    args = parser.parse_args(argv)
    before = load()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        source, out = root / "exported", root / "plugged"
        source.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        size = build(source, args.gib, args.rows)
        built = time.perf_counter() - start
        port = free_port()
        server = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("posenc")),
                "serve",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ]
        )
        try:
            while status(port, "/v2/health/ready") != 200:
                if server.poll() is not None:
                    raise RuntimeError(f"posenc serve exited with {server.returncode}")
                time.sleep(0.05)
            plug = [
                str(Path(sys.executable).with_name("posenc-client")),
                "--url", f"http://127.0.0.1:{port}", "--no-cache", "plug",
                str(source / "model.onnx"), "--hf-config", str(CONFIG),
                "-o", str(out / "plugged.onnx"),
            ]  # fmt: skip
            start = time.perf_counter()
            done = subprocess.run(plug, capture_output=True, text=True)
            seconds = time.perf_counter() - start
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        finally:
            server.terminate()
            server.wait(timeout=60)
        if done.returncode:
            print(done.stderr)
            return done.returncode
        files = sorted(out.iterdir())
        print(header(f"python -m bench.plug --gib {args.gib} --rows {args.rows}", before))
        print()
        print(
            table(
                ["model", "data file", "build (sparse)", "plug wall", "plug peak RSS"],
                [
                    [
                        f"GQA + {args.rows}-row caches",
                        mib(size),
                        f"{built:.2f} s",
                        f"{seconds:.2f} s",
                        mib(peak),
                    ]
                ],
            )
        )
        print()
        print(done.stderr.strip())
        for path in files:
            links = os.stat(path).st_nlink
            print(f"- {path.name}: {mib(path.stat().st_size)}, {links} link(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
