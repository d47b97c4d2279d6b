"""`JsonMemo`: what a route derives from a JSON request (a validated spec, its content key...),
remembered per distinct request.

Clients send the same requests again and again: a decode loop the same /v2 parameters every
step, each replica or process start the same `POST /v1/tables` spec. Validation, the canonical
form and the sha256 key are pure functions of the JSON, so they run once per distinct value:
the memo key is the value serialised with sorted keys (equal JSON, equal key, whatever the
spelling of the body). Bounded LRU of small values only (a spec carrying its weight table
inline, or a large config, is built every time: memory stays bounded by `size * max_bytes`);
failures are not remembered (they raise every time).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import orjson

T = TypeVar("T")


class JsonMemo(Generic[T]):
    """`get(value, build)`: `build()`'s result for JSON `value`, computed once per distinct
    value of at most `max_bytes` serialised (at most `size` remembered, least recently used
    forgotten first)."""

    def __init__(self, size: int = 1024, max_bytes: int = 16 << 10) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self._items: OrderedDict[bytes, T] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, value: Mapping[str, Any], build: Callable[[], T]) -> T:
        try:
            key = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            return build()
        if len(key) > self.max_bytes:
            return build()
        item = self._items.get(key)
        if item is None:
            item = build()
            self._items[key] = item
            if len(self._items) > self.size:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(key)
        return item
