"""Serving representations: everything between a route's canonical spec (or resource) and the
bytes on the wire, one idea per module. Route modules never import each other; what several of
them need lives here.

- `formats.py`: `Format`, one complete record per table wire format (media types and aliases for
  `Accept` and uploads, encoder, decoder, zero-copy, ranges, headers), `FORMATS`, `UPLOADS`,
  `negotiate`; `encode.py` the encoders, `decode.py` the upload decoders;
- `selection.py`: the `tensor` and `rows` a request selects, checked before computing;
- `table.py`: `serve_table`, the table representation (limits, ETag, 304, encoding, digest,
  Range, the in-flight charges), `representation_etag`, `check_size`;
- `assets.py`: `Asset`, `send_asset`: the files the server ships (the explorer's, the API
  documentation's bundles) with their ETag, 304 and `no-cache`;
- `conditional.py`: the one ETag rule and 304 path (`etag_matches`, `device_etag`,
  `not_modified`, `IMMUTABLE`) for tables, previews, ONNX models and the explorer's files;
- `ranges.py`: the one Range path (206, 416, If-Range); `head.py`: the one HEAD path
  (`HeadRequests`: every GET route answers HEAD);
- `body.py`: `BodyResponse` (sent in views, holding its in-flight charges), `acquire`;
- `digest.py`: `Repr-Digest`; `params.py`: the table routes' OpenAPI parameters and responses,
  derived from the format records; `preview.py`: `serve_preview`;
- `bind.py`: uploaded weight tables bound to the specs naming them; `describe.py`:
  `describe_spec`, a canonical spec as the catalog shows it.
"""
