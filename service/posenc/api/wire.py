"""Counting what a protobuf message would make the parser allocate, before it is parsed.

Parsing an ONNX `ModelProto` allocates a Python-visible message per repeated entry: 15 MiB of
empty `NodeProto` entries (2 bytes each on the wire) become millions of messages, over 1 GiB.
`count_graph_entries` walks the wire format (field numbers from onnx/onnx.proto3) without
allocating and stops as soon as the count passes the limit:

- `ModelProto.graph` (7) and `ModelProto.functions` (25, `FunctionProto`: its `node`, 7);
- in a `GraphProto`, a `FunctionProto` and a `NodeProto`, every length-delimited field (nodes,
  initializers, inputs, outputs, value_info, attributes, names, doc strings) counts one, counted
  while scanning, so the scan itself never holds more than `limit` of them;
- a node's attributes (5) are read, and their graphs (`g` 6, `graphs` 11) walked the same way, at
  most `MAX_DEPTH` levels deep.
"""

from __future__ import annotations

MAX_DEPTH = 32
"""Nested subgraphs walked (protobuf's own parser stops at 100 levels)."""


class TooManyEntries(Exception):  # noqa: N818 - the condition
    """The message holds more than `limit` entries (or subgraphs nested past `MAX_DEPTH`)."""

    def __init__(self, limit: int, depth: bool = False) -> None:
        what = f"subgraphs nested deeper than {MAX_DEPTH}" if depth else f"over {limit} entries"
        super().__init__(what)
        self.limit = limit


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("malformed varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _delimited(
    buf: bytes, start: int, end: int, counter: _Counter | None = None
) -> list[tuple[int, int, int]]:
    """(field number, start, end) of the length-delimited fields in `buf[start:end]`, each
    counted by `counter` as it is found."""
    out: list[tuple[int, int, int]] = []
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > end:
                raise ValueError("truncated field")
            if counter is not None:
                counter.bump()
            out.append((field, pos, pos + size))
            pos += size
        else:
            raise ValueError(f"wire type {wire}")
    return out


class _Counter:
    def __init__(self, buf: bytes, limit: int) -> None:
        self.buf = buf
        self.limit = limit
        self.count = 0

    def bump(self) -> None:
        self.count += 1
        if self.count > self.limit:
            raise TooManyEntries(self.limit)

    def graph(self, start: int, end: int, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise TooManyEntries(self.limit, depth=True)
        for field, s, e in _delimited(self.buf, start, end, self):
            if field == 1:
                self.node(s, e, depth)

    def node(self, start: int, end: int, depth: int) -> None:
        for field, s, e in _delimited(self.buf, start, end, self):
            if field == 5:
                for sub, gs, ge in _delimited(self.buf, s, e, self):
                    if sub in (6, 11):
                        self.graph(gs, ge, depth + 1)

    def function(self, start: int, end: int) -> None:
        for field, s, e in _delimited(self.buf, start, end, self):
            if field == 7:
                self.node(s, e, 1)


def count_graph_entries(body: bytes, limit: int) -> int:
    """The entries of the ONNX model `body` (module docstring); raises `TooManyEntries` as soon as
    they pass `limit`. A body that is not well-formed protobuf counts what precedes the fault (the
    parser then refuses it)."""
    counter = _Counter(body, limit)
    try:
        for field, start, end in _delimited(body, 0, len(body)):
            if field == 7:
                counter.graph(start, end, 0)
            elif field == 25:
                counter.function(start, end)
    except ValueError:
        pass
    return counter.count
