"""The HTTP endpoints, one module per resource; `posenc.api.app.create_app` composes their routers.

| module    | routes                                                               |
|-----------|----------------------------------------------------------------------|
| `tables`  | `POST /v1/tables`, `GET /v1/tables/{key}` (hot), `GET .../preview`   |
| `uploads` | `POST /v1/uploads`, `GET /v1/uploads/{table_key}`                    |
| `resolve` | `POST /v1/resolve`                                                   |
| `mrope`   | `POST /v1/mrope/position_ids`                                        |
| `presets` | `GET /v1/presets[/{name}[/{part}[/table]]]`                          |
| `kinds`   | `GET /v1/kinds`                                                      |
| `onnx`    | `GET /v1/onnx`, `POST /v1/onnx`, `GET /v1/onnx/{key}`                |
| `check`   | `POST /v1/check/onnx`: a model's baked RoPE caches against a table   |
| `oip`     | `GET /v2`, `/v2/models/{model}[/versions/{version}][/ready, /config, |
|           | /infer]` (infer is hot)                                              |
| `health`  | `GET /v2/health/live`, `GET /v2/health/ready`, `GET /metrics`        |
| `ui`      | `GET /ui`, `GET /ui/{name}`: the explorer page and its assets        |
| `docs`    | `GET /docs`, `GET /redoc`, `GET /docs/assets/{name}`: Swagger UI and |
|           | ReDoc, their bundles served offline                                  |

Route modules never import each other (an import-linter contract): what several need is in
`posenc.api.serving` (representations: formats, ETags and 304, HEAD, Range, sending tables,
uploaded weight tables), `posenc.api.deps` (the
FastAPI dependencies) and `posenc.api.specs` (wire JSON -> specs). Hot routes are served by
`posenc.api.hot` and take no dependencies.
"""
