"""A truthful OpenAPI (issue 23, item 7): the Bearer scheme on the guarded routes, each route's
errors with the error model, request bodies typed per kind, every path parameter declared, a
405's `Allow` naming every method of the path, and `protect_docs_and_metrics` putting /metrics
and the OpenAPI pages behind the key (health open). schemathesis checks the document against the
server's answers (test_schemathesis.py); these tests pin what the issue found missing."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from pydantic import ValidationError

from posenc.api import Settings
from posenc.api.error_types import ERROR_TYPES
from posenc.encodings import FAMILIES
from tests.conftest import ServerHandle, start_server

KEY = "openapi-key"


@pytest.fixture(scope="module")
def guarded() -> Iterator[ServerHandle]:
    with start_server(api_keys=[KEY], protect_docs_and_metrics=True) as handle:
        yield handle


def test_document_of_an_open_server(client: httpx.Client) -> None:
    doc = client.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "one of POSENC_API_KEYS (only when set)",
    }
    paths = doc["paths"]
    # no key configured: no operation claims to need one
    assert not any("security" in op for item in paths.values() for op in item.values())
    for path, item in paths.items():
        for op in item.values():
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == set(path.replace("}", "{").split("{")[1::2]), path
            assert "HTTPValidationError" not in str(op)
            if "{" in path:
                assert "404" in op["responses"], path
    assert {"400", "413", "415", "422"} <= set(paths["/v1/resolve"]["post"]["responses"])
    error = paths["/v1/tables"]["post"]["responses"]["422"]["content"]["application/json"]
    assert error["schema"] == {"$ref": "#/components/schemas/Error"}
    oip = paths["/v2/models/{model}/infer"]["post"]["responses"]["400"]
    assert oip["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/OipError"}
    schemas = doc["components"]["schemas"]
    fields = schemas["SpecFields"]
    assert set(fields["discriminator"]["mapping"]) == set(FAMILIES)
    assert len(fields["oneOf"]) == len(FAMILIES)
    body = paths["/v1/tables"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/SpecObject"}
    assert schemas["RopeSpec"]["properties"]["kind"] == {"const": "rope", "type": "string"}
    onnx = paths["/v1/onnx"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert onnx == {"$ref": "#/components/schemas/OnnxRequest"}
    assert "llama-3.1-8b" in schemas["SpecFromPreset"]["properties"]["preset"]["enum"]


def test_every_route_declares_its_errors_from_the_catalog(client: httpx.Client) -> None:
    """Each documented error status names the catalog's error_types it carries (the route's own
    declaration); the 413 of POST /v1/tables names every cause: the body cap, the table and the
    JSON limit."""
    paths = client.get("/openapi.json").json()["paths"]
    for path, item in paths.items():
        for method, op in item.items():
            for status, response in op["responses"].items():
                # the protocol's routes answer its {"error"} (OipError), without error_type
                if int(status) < 400 or path.startswith(("/v2/models", "/v2/repository")):
                    continue
                named = [part.split(":")[0] for part in response["description"].split("; ")]
                for name in named:
                    assert name in ERROR_TYPES, (method, path, status, name)
                    assert int(status) in ERROR_TYPES[name].statuses, (method, path, name)
    too_large = paths["/v1/tables"]["post"]["responses"]["413"]["description"]
    for cause in ("body_too_large", "too_large", "too_large_for_json"):
        assert f"{cause}: {ERROR_TYPES[cause].summary}" in too_large.split("; ")


def test_domain_error_types_are_in_the_catalog() -> None:
    """Every error class of the core and the exporters sends an error_type of the catalog."""
    import posenc.onnx  # noqa: F401  (registers its error classes)
    from posenc.encodings import PosencError

    found: set[str] = set()
    todo = [PosencError]
    while todo:
        cls = todo.pop()
        found.add(cls.error_type)
        todo.extend(cls.__subclasses__())
    assert found - {"posenc_error"} <= set(ERROR_TYPES)
    assert len(found) > 5


def test_allow_names_every_method_of_the_path(client: httpx.Client) -> None:
    for method, path, allow in [
        ("DELETE", "/v1/onnx", "GET, HEAD, POST"),
        ("PUT", "/v1/tables", "POST"),
        ("POST", "/v1/tables/" + "0" * 64, "GET, HEAD"),
        ("DELETE", "/v2/models/rope/infer", "POST"),
    ]:
        r = client.request(method, path)
        assert r.status_code == 405
        assert r.headers["allow"] == allow
        assert r.json()["error_type"] == "method_not_allowed"


def test_guarded_server(guarded: ServerHandle) -> None:
    with (
        guarded.client() as anonymous,
        guarded.client(headers={"Authorization": f"Bearer {KEY}"}) as keyed,
    ):
        for path in ("/metrics", "/docs", "/redoc", "/openapi.json", "/v1/kinds"):
            refused = anonymous.get(path)
            assert refused.status_code == 401, path
            assert refused.headers["www-authenticate"].startswith("Bearer")
            assert keyed.get(path).status_code == 200, path
        for path in ("/v2/health/live", "/v2/health/ready", "/v2"):
            assert anonymous.get(path).status_code == 200, path
        doc = keyed.get("/openapi.json").json()
    ops = {(m, p): op for p, item in doc["paths"].items() for m, op in item.items()}
    assert ops[("get", "/metrics")]["security"] == [{"bearer": []}]
    assert "401" in ops[("post", "/v1/tables")]["responses"]
    assert "security" not in ops[("get", "/v2/health/ready")]
    assert "security" not in ops[("get", "/v2")]


def test_protecting_docs_needs_keys() -> None:
    with pytest.raises(ValidationError, match="protect_docs_and_metrics needs api_keys"):
        Settings(protect_docs_and_metrics=True)
