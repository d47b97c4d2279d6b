"""`Repr-Digest` (RFC 9530) of a representation, computed once per cached body."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import Hashable

from posenc.runtime import OFFLOAD_BYTES, Buffer, CacheEntry


def repr_digest(body: Buffer) -> str:
    """The RFC 9530 `Repr-Digest` field value of `body`: `sha-256=:<base64 of the sha256>:`
    (a structured-field dictionary holding one byte sequence)."""
    digest = hashlib.sha256(body).digest()
    return f"sha-256=:{base64.b64encode(digest).decode()}:"


async def entry_digest(entry: CacheEntry, variant: Hashable, body: Buffer) -> str:
    """`repr_digest(body)` for the whole representation `variant` of `entry`, computed once and
    kept on the entry (in a worker thread above `OFFLOAD_BYTES`: hashlib releases the GIL)."""
    known = entry.digests.get(variant)
    if known is not None:
        return known
    size = body.nbytes if isinstance(body, memoryview) else len(body)
    value = (
        await asyncio.to_thread(repr_digest, body) if size > OFFLOAD_BYTES else repr_digest(body)
    )
    entry.digests[variant] = value
    return value
