"""One verdict, three doors: `posenc-client verify --json`, the library's `verify_model` and the
server's `POST /v1/check/onnx` run on one model must give the same outcome per site.

`verify_three_ways` runs all three for a model file and a config.json (the route's `?key=` is
the config's rope table, resolved by the same server; a model with external data is sent to the
route with its data inline, since the route reads no data file) and returns the CLI's exit code
and JSON after asserting that every site has the same name, side, kind, verdict, first
departure and ulp error everywhere, and that the whole model's outcome is the same.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

from posenc_client import Client
from posenc_client.cli import main
from tests.conftest import ServerHandle

SITE_FIELDS = ("name", "side", "kind", "verdict", "first", "max_ulp", "rows", "dtype")


def cli(server: ServerHandle, root: Path, *args: str) -> tuple[int, str]:
    """Run posenc-client against `server` with its own cache under `root`: (code, output)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(["--url", server.url, "--cache-dir", str(root / "cache"), *args])
    return code, out.getvalue() + err.getvalue()


def _site(report: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(
        tuple(report[f]) if isinstance(report[f], list) else report[f] for f in SITE_FIELDS
    )


def _inline(model: Path, root: Path) -> Path:
    """The model with its external data inline (the route reads no data file: a model with
    external data is sent whole here so that its sites are compared as the CLI compares them;
    tests/api/test_check_onnx.py covers the graph-only upload)."""
    import onnx

    graph = onnx.load(model, load_external_data=False)
    if not any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.graph.initializer):
        return model
    whole = onnx.load(model)
    path = root / f"inline-{model.name}"
    onnx.save(whole, path)
    return path


def route_check(server: ServerHandle, model: Path, config: Path) -> dict[str, Any]:
    """POST /v1/check/onnx with the model's bytes and the key of the config's rope table."""
    with Client(server.url, cache=False) as client:
        (spec,) = client.resolve(json.loads(config.read_text()), kind="rope")
        key = spec.key
    with server.client() as http:
        response = http.post(
            "/v1/check/onnx",
            params={"key": key},
            content=model.read_bytes(),
            headers={"Content-Type": "application/octet-stream"},
        )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def verify_three_ways(
    server: ServerHandle, root: Path, model: Path, config: Path, *extra: str
) -> tuple[int, dict[str, Any]]:
    """(exit code, CLI JSON) after asserting the CLI, the library and the route agree."""
    from posenc_client.cli import _request_fields, build_parser
    from posenc_client.onnx import find_rope_consumers, outcome, verify_model

    code, output = cli(server, root, "verify", str(model), "--config", str(config), "--json",
                       *extra)  # fmt: skip
    start = output.index("{")
    report: dict[str, Any] = json.loads(output[start : output.rindex("}") + 1])
    assert report["exit_code"] == code, output
    cli_sites = [_site(s) for s in report["sites"]]

    with Client(server.url, cache=root / "cache") as client:
        config_json = json.loads(config.read_text())
        args = build_parser().parse_args(["verify", str(model), "--config", str(config)])
        gqa = any(c.op.endswith("GroupQueryAttention") for c in find_rope_consumers(model))

        def tables_for(request: Any) -> Any:
            (found,) = client.tables_for_model(
                config_json, device="cpu", **_request_fields(request, args, gqa, {})
            ).values()
            return found

        reports = verify_model(model, tables_for)
    library_sites = [
        _site({**r.__dict__, "first": list(r.first) if r.first else None}) for r in reports
    ]
    assert library_sites == cli_sites
    assert outcome(reports) == report["outcome"]

    answer = route_check(server, _inline(model, root), config)
    route_sites = [_site(r) for r in answer["caches"]]
    assert route_sites == cli_sites, (route_sites, cli_sites)
    assert answer["outcome"] == report["outcome"]
    assert sorted({r["exact_key"] for r in answer["caches"] if r["exact_key"]}) == sorted(
        report["exact_keys"]
    )
    return code, report
