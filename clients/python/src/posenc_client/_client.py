"""`Client` and `AsyncClient`: two drivers of the sans-I/O core in `_core.py`, as httpx shapes its
own (a `BaseClient` holding what both share, a sync and an async subclass doing the I/O).

`BaseClient` holds the options and the `Core`. Each client method asks the core for a flow and
runs it (`_run`): every `Call` the flow yields is sent through httpx by `_send`, with the retries
the core decides (connection errors and 503s, exponential backoff, a server's Retry-After wins)
and the body streamed through `progress`; a `TransportError` left after the retries is thrown into
the flow, which may fall back to its cache. The methods' keywords are declared once, in
`_options.py` (`RopeOptions`, `AlibiOptions`, ...), and spelled out here with `typing.Unpack`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, Unpack

import httpx

from posenc_client._cache import DiskCache
from posenc_client._core import (
    Call,
    ConfigLike,
    Core,
    Flow,
    Reply,
    Retries,
    transport_error,
)
from posenc_client._exceptions import DecodeError, TransportError
from posenc_client._onnx_model import OnnxModel
from posenc_client._options import (
    JSON,
    AlibiOptions,
    OnnxOptions,
    RopeOptions,
    SinusoidalOptions,
    T5BiasOptions,
    load_config,
)
from posenc_client._results import MRopePositions, Preset, ResolvedSpecs
from posenc_client._rows import Rows
from posenc_client._tables import Tables

log = logging.getLogger("posenc_client")

T = TypeVar("T")

Progress = Callable[[int, int | None], None]
"""`progress(received_bytes, total_bytes_or_None)`, called as a response body arrives."""


MAX_BODY_BYTES = 4 << 30
"""The largest answer body the client takes in (the server's tables are at most its
`max_response_bytes`, 512 MiB by default): a larger `Content-Length`, or a body growing past it,
is a `DecodeError` before (or as soon as) it is held."""


class _Reader:
    """Accumulates a streamed body into one bytearray, reporting progress. The body is read raw:
    the client asks for `identity`, and an answer in any other content encoding is refused
    (`DecodeError`) before its body is read, never decompressed (4 MiB of gzip can be 4 GiB);
    bodies are capped at `MAX_BODY_BYTES`."""

    def __init__(self, response: httpx.Response, progress: Progress | None) -> None:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise DecodeError(
                f"the answer is in content encoding {encoding[:40]!r}; the client asked for "
                "identity and does not decode others"
            )
        length = response.headers.get("content-length")
        self.total = int(length) if length and length.isdigit() else None
        if self.total is not None and self.total > MAX_BODY_BYTES:
            raise DecodeError(
                f"the answer declares {self.total} bytes, more than the client's limit of "
                f"{MAX_BODY_BYTES}"
            )
        self.buffer = bytearray()
        self.progress = progress
        self.status = response.status_code
        self.headers = response.headers

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        if len(self.buffer) > MAX_BODY_BYTES:
            raise DecodeError(f"the answer grew past the client's limit of {MAX_BODY_BYTES} bytes")
        if self.progress is not None:
            self.progress(len(self.buffer), self.total)

    def reply(self) -> Reply:
        return Reply(self.status, self.headers, self.buffer)


def _raw_chunks(response: httpx.Response) -> Iterator[bytes]:
    """The body as sent (never decoded: `_Reader` refused other encodings); a response a
    transport already read (a test's, a mock's) is its content."""
    try:
        content = response.content
    except httpx.ResponseNotRead:
        yield from response.iter_raw()
    else:
        yield content


async def _araw_chunks(response: httpx.Response) -> AsyncIterator[bytes]:
    """`_raw_chunks` of an async response."""
    try:
        content = response.content
    except httpx.ResponseNotRead:
        async for chunk in response.aiter_raw():
            yield chunk
    else:
        yield content


class BaseClient:
    """What `Client` and `AsyncClient` share: the options, the sans-I/O `Core` (every request
    built, every answer decoded there) and the retry loop's decisions, logged the same way."""

    def __init__(
        self,
        base_url: str | None,
        *,
        api_key: str | None,
        retries: int | Retries,
        cache: bool | str | os.PathLike[str] | DiskCache,
        offline: bool | None,
        revalidate: bool,
        headers: Mapping[str, str] | None,
        progress: Progress | None,
        cache_max_bytes: int | str | None = None,
    ) -> None:
        self._core = Core(
            base_url, api_key, retries, cache, offline, revalidate, headers, cache_max_bytes
        )
        self.progress = progress

    @property
    def base_url(self) -> str:
        return self._core.base_url

    @property
    def cache(self) -> DiskCache | None:
        """The disk cache, or None."""
        return self._core.cache

    @property
    def offline(self) -> bool:
        """Whether the client never touches the network (`offline=`, else `$POSENC_OFFLINE`)."""
        return self._core.offline

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r}, cache={self.cache!r})"

    def _build_request(self, http: httpx.Client | httpx.AsyncClient, call: Call) -> httpx.Request:
        return http.build_request(
            call.method, call.path, json=call.json, params=call.params, headers=call.headers
        )

    def _wait_after_error(self, call: Call, err: httpx.HTTPError, attempt: int) -> float:
        """Seconds to wait before the next attempt after a transport error; raises the client's
        `TransportError` (chained to `err`) when the retries are spent."""
        wait = self._core.retry_after_error(call, err, attempt)
        if wait is None:
            raise transport_error(err, call, self._core.base_url) from err
        log.debug("retrying %s %s in %.2fs: %r", call.method, call.path, wait, err)
        return wait

    def _wait_after_reply(self, call: Call, reply: Reply, attempt: int) -> float | None:
        """Seconds to wait before retrying this answer (a 503), or None to hand it on."""
        wait = self._core.retry_after_reply(call, reply, attempt)
        if wait is not None:
            log.debug("retrying %s %s in %.2fs: 503", call.method, call.path, wait)
        return wait


class Client(BaseClient):
    """A synchronous posenc client.

    Args:
        base_url: the server (default `$POSENC_URL`, else http://127.0.0.1:8000); a path prefix
            is kept (`https://host/posenc` -> `https://host/posenc/v1/...`); `host:port`
            without a scheme (tritonclient's spelling) is `http://host:port`; anything but an
            http(s) URL of a host is a ValueError here, not a connection error later.
        api_key: sent as `Authorization: Bearer <key>` (default `$POSENC_API_KEY`): visible
            ASCII and spaces, what a header carries (ValueError otherwise).
        timeout: seconds, or an `httpx.Timeout`.
        retries: retries after the first attempt on connection errors, timeouts and 503
            (an int, or a `Retries` policy with the backoff).
        transport: an httpx transport to send through (`httpx.MockTransport`, a proxy, ...).
        cache: the disk cache: True (default folder, see `DiskCache`), a folder, a `DiskCache`,
            or False for none.
        offline: never touch the network: cached tables only (`CacheMissError` otherwise), and
            a model id's config.json from the Hugging Face cache only;
            default `$POSENC_OFFLINE` (1, true, yes or on; 0, false, no, off or empty: false;
            any case; another value is a ValueError naming it), else False.
        revalidate: revalidate cached tables with If-None-Match (default); False trusts them
            without asking (they are immutable under their key).
        headers: extra request headers.
        progress: `progress(received, total)` called as response bodies arrive.
        cache_max_bytes: the disk cache's size cap, an int or a size such as `4GiB` (default
            `$POSENC_CACHE_MAX_BYTES`, else none): least recently used entries are deleted after
            each write (`DiskCache.prune`). A `DiskCache` passed as `cache` carries its own.

    Use as a context manager, or call `close()`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 60.0,
        retries: int | Retries = 3,
        transport: httpx.BaseTransport | None = None,
        cache: bool | str | os.PathLike[str] | DiskCache = True,
        offline: bool | None = None,
        revalidate: bool = True,
        headers: Mapping[str, str] | None = None,
        progress: Progress | None = None,
        cache_max_bytes: int | str | None = None,
    ) -> None:
        super().__init__(
            base_url,
            api_key=api_key,
            retries=retries,
            cache=cache,
            offline=offline,
            revalidate=revalidate,
            headers=headers,
            progress=progress,
            cache_max_bytes=cache_max_bytes,
        )
        self._http = httpx.Client(
            base_url=self._core.base_url,
            headers=self._core.headers,
            timeout=timeout,
            transport=transport,
            follow_redirects=True,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _send(self, call: Call) -> Reply:
        attempt = 0
        wait: float | None
        while True:
            request = self._build_request(self._http, call)
            try:
                response = self._http.send(request, stream=True)
                try:
                    reader = _Reader(response, self.progress)
                    for chunk in _raw_chunks(response):
                        reader.feed(chunk)
                finally:
                    response.close()
            except httpx.HTTPError as err:
                wait = self._wait_after_error(call, err, attempt)
            else:
                reply = reader.reply()
                wait = self._wait_after_reply(call, reply, attempt)
                if wait is None:
                    return reply
            time.sleep(wait)
            attempt += 1

    def _run(self, flow: Flow[T]) -> T:
        try:
            call = next(flow)
            while True:
                try:
                    reply = self._send(call)
                except TransportError as err:
                    call = flow.throw(err)
                else:
                    call = flow.send(reply)
        except StopIteration as stop:
            result: T = stop.value
            return result

    def table(self, spec: Mapping[str, Any], *, rows: Rows | None = None) -> Tables:
        """The table for a spec object, the server's one spec language: fields (`kind` selects
        the family; see `kinds()`), `{"hf_config": {...}, "layer_type"?, ...overrides}` when the
        config needs exactly one table, or `{"preset": NAME, "part"?: PART, ...overrides}`.

        `rows=(start, end)` (or `slice(start, end)`; `end=None`: to the last position) returns
        only positions [start, end) of every tensor with a position axis (axis 0 of RoPE and
        sinusoidal tables, the query axis 1 of an (H, Q, K) bias; `inv_freq` and `slopes` come
        whole), with `meta["rows"] == [start, end]`. A cached whole table is sliced without a
        request; otherwise the server sends just those rows (`?rows=START:END`), which are not
        cached. A range covering every position gives the whole table. Raises
        `InvalidRowsError` (a `ValueError`) for a malformed range, before any request, and for
        one past the table's positions or a table without a position axis.
        """
        return self._run(self._core.table(spec, rows=rows))

    def table_by_key(
        self, key: str, *, rows: Rows | None = None, device: str | None = None
    ) -> Tables:
        """The table `key` names: a table URL the server handed out (`Content-Location`, the
        `url` of `resolve` and the presets: `/v1/tables/{key}.{spec}`, absolute or a path),
        which any replica answers, even one that never saw the spec or restarted since; or a
        bare content key, which only a server that resolved it (or a preset's) answers. `rows`
        as in `table`; `device="cpu"`: the reference bytes whatever the server's device, past
        the disk cache (as `tables_for_model`)."""
        return self._run(self._core.table_by_key(key, rows=rows, device=device))

    def rope(
        self,
        head_dim: int,
        max_positions: int | None = None,
        *,
        rows: Rows | None = None,
        **options: Unpack[RopeOptions],
    ) -> Tables:
        """RoPE cos/sin caches (and inv_freq), keywords named as in transformers' configs
        (`RopeOptions`).

        Scaling keys may be given flat (`rope_type="llama3", factor=8.0, low_freq_factor=1.0`)
        or as `rope_scaling={...}` / `rope_parameters={...}`; `profile` picks a consumer's
        layout (`hf`, `onnx`, `ort_gqa`, `vllm`, `flash_attn`, ...); the other spec fields
        (`width`, `interleaved`, `full_layout`, `packing`, `seq_len`, `precision`) pass through
        as well.
        `rows=(start, end)`: positions [start, end) only (see `table`).
        """
        return self._run(self._core.rope(head_dim, max_positions, options, rows))

    def alibi(
        self, num_heads: int, *, rows: Rows | None = None, **options: Unpack[AlibiOptions]
    ) -> Tables:
        """ALiBi slopes (H,), plus the additive bias (H, Q, K) when `bias` names a form
        (`AlibiOptions`); `rows=(start, end)` picks queries [start, end) of the bias (see
        `table`)."""
        return self._run(self._core.alibi(num_heads, options, rows))

    def sinusoidal(
        self,
        dim: int,
        max_positions: int | None = None,
        *,
        rows: Rows | None = None,
        **options: Unpack[SinusoidalOptions],
    ) -> Tables:
        """A sinusoidal position table `embedding` (P, dim) (`SinusoidalOptions`); `rows` as in
        `table`."""
        return self._run(self._core.sinusoidal(dim, max_positions, options, rows))

    def t5_bias(
        self, *, query_length: int, rows: Rows | None = None, **options: Unpack[T5BiasOptions]
    ) -> Tables:
        """T5 relative position `buckets` (Q, K), plus `bias` (H, Q, K) when weights are
        given (`T5BiasOptions`); `rows=(start, end)` picks queries [start, end) (see `table`)."""
        return self._run(self._core.t5_bias(query_length, options, rows))

    def resolve(self, config: ConfigLike, **overrides: Any) -> ResolvedSpecs:
        """The tables a model needs, from its config.json (path, folder, dict, or a Hugging Face
        model id `ORG/NAME[@REVISION]` with `posenc-client[hub]`: see README, "Model ids"): specs,
        keys and notes (a list of `ResolvedSpec`); its `unserved` lists the parts the server serves
        no table for, each with the reason and config key. `overrides` (`profile`,
        `max_positions`, `dtype`, `kind`, `layer_type`, ...) apply to every spec that has the
        field."""
        return self._run(self._core.resolve(config, overrides))

    def tables_for_model(
        self, config: ConfigLike, *, device: str | None = None, **overrides: Any
    ) -> dict[str, Tables]:
        """Every table a model needs, by name (`rope`, `rope:sliding_attention`, `alibi`, ...),
        each carrying the resolve notes. Same `overrides` as `resolve`. `device="cpu"`: the
        reference bytes computed on the CPU whatever the server's device (a GPU's may differ by
        an ulp), from the server, past the disk cache: what `verify` compares with."""
        return self._run(self._core.tables_for_model(config, overrides, device))

    def presets(self) -> list[Preset]:
        """The curated released models (names, parts and keys)."""
        return self._run(self._core.presets())

    def preset(self, name: str) -> Preset:
        """One preset with its parts' canonical specs."""
        return self._run(self._core.preset(name))

    def preset_tables(self, name: str) -> dict[str, Tables]:
        """The tables of a preset, by part name."""
        return self._run(self._core.preset_tables(name))

    def mrope_position_ids(
        self,
        layout: Sequence[Mapping[str, Any]],
        *,
        model_type: str | None = None,
        config: ConfigLike | None = None,
        spatial_merge_size: int | None = None,
        tokens_per_second: float | None = None,
        temporal_merge_size: int | None = None,
        position_id_per_seconds: float | None = None,
    ) -> MRopePositions:
        """M-RoPE position ids (3, N) of a token layout, as transformers' `get_rope_index` of the
        model named by `model_type` or its `config` (config.json path, folder, dict or model
        id). `layout`: spans `{"text": n}`, `{"image": [t, h, w]}`, `{"video": [t, h, w],
        "second_per_grid_t"?: s}` in sequence order; the vision parameters override the
        config's."""
        options = {
            "spatial_merge_size": spatial_merge_size,
            "tokens_per_second": tokens_per_second,
            "temporal_merge_size": temporal_merge_size,
            "position_id_per_seconds": position_id_per_seconds,
        }
        return self._run(self._core.mrope_position_ids(layout, model_type, config, options))

    def kinds(self) -> list[JSON]:
        """The families: kind, summary, required fields, valid values and JSON schema."""
        return self._run(self._core.kinds())

    def onnx(
        self, spec: Mapping[str, Any], *, graph: str, **options: Unpack[OnnxOptions]
    ) -> OnnxModel:
        """The verified ONNX subgraph `graph` (`cos_sin`, `rotary`, `bias`, `embedding`) for a
        spec object (as in `table`), at `opset` (17..23), `mode` (`table`/`compute`), `op`
        (`decomposed`/`onnx`/`contrib`), `inputs` (`positions`/`lengths`) (`OnnxOptions`)."""
        return self._run(self._core.onnx(spec, graph, options))

    def ready(self) -> bool:
        """True when the server answers /v2/health/ready with 200."""
        return self._run(self._core.ready())


class AsyncClient(BaseClient):
    """The asyncio twin of `Client`: the same arguments (`transport` is an
    `httpx.AsyncBaseTransport`), the same methods as coroutines."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 60.0,
        retries: int | Retries = 3,
        transport: httpx.AsyncBaseTransport | None = None,
        cache: bool | str | os.PathLike[str] | DiskCache = True,
        offline: bool | None = None,
        revalidate: bool = True,
        headers: Mapping[str, str] | None = None,
        progress: Progress | None = None,
        cache_max_bytes: int | str | None = None,
    ) -> None:
        super().__init__(
            base_url,
            api_key=api_key,
            retries=retries,
            cache=cache,
            offline=offline,
            revalidate=revalidate,
            headers=headers,
            progress=progress,
            cache_max_bytes=cache_max_bytes,
        )
        self._http = httpx.AsyncClient(
            base_url=self._core.base_url,
            headers=self._core.headers,
            timeout=timeout,
            transport=transport,
            follow_redirects=True,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def _send(self, call: Call) -> Reply:
        attempt = 0
        wait: float | None
        while True:
            request = self._build_request(self._http, call)
            try:
                response = await self._http.send(request, stream=True)
                try:
                    reader = _Reader(response, self.progress)
                    async for chunk in _araw_chunks(response):
                        reader.feed(chunk)
                finally:
                    await response.aclose()
            except httpx.HTTPError as err:
                wait = self._wait_after_error(call, err, attempt)
            else:
                reply = reader.reply()
                wait = self._wait_after_reply(call, reply, attempt)
                if wait is None:
                    return reply
            await asyncio.sleep(wait)
            attempt += 1

    async def _run(self, flow: Flow[T]) -> T:
        try:
            call = next(flow)
            while True:
                try:
                    reply = await self._send(call)
                except TransportError as err:
                    call = flow.throw(err)
                else:
                    call = flow.send(reply)
        except StopIteration as stop:
            result: T = stop.value
            return result

    async def table(self, spec: Mapping[str, Any], *, rows: Rows | None = None) -> Tables:
        """See `Client.table`."""
        return await self._run(self._core.table(spec, rows=rows))

    async def table_by_key(
        self, key: str, *, rows: Rows | None = None, device: str | None = None
    ) -> Tables:
        """See `Client.table_by_key`."""
        return await self._run(self._core.table_by_key(key, rows=rows, device=device))

    async def rope(
        self,
        head_dim: int,
        max_positions: int | None = None,
        *,
        rows: Rows | None = None,
        **options: Unpack[RopeOptions],
    ) -> Tables:
        """See `Client.rope`."""
        return await self._run(self._core.rope(head_dim, max_positions, options, rows))

    async def alibi(
        self, num_heads: int, *, rows: Rows | None = None, **options: Unpack[AlibiOptions]
    ) -> Tables:
        """See `Client.alibi`."""
        return await self._run(self._core.alibi(num_heads, options, rows))

    async def sinusoidal(
        self,
        dim: int,
        max_positions: int | None = None,
        *,
        rows: Rows | None = None,
        **options: Unpack[SinusoidalOptions],
    ) -> Tables:
        """See `Client.sinusoidal`."""
        return await self._run(self._core.sinusoidal(dim, max_positions, options, rows))

    async def t5_bias(
        self, *, query_length: int, rows: Rows | None = None, **options: Unpack[T5BiasOptions]
    ) -> Tables:
        """See `Client.t5_bias`."""
        return await self._run(self._core.t5_bias(query_length, options, rows))

    async def _read_config(self, config: ConfigLike) -> JSON:
        """A config as `load_config` reads it, in a worker thread: a file, or a model id's
        config.json from the Hugging Face cache or the Hub, never blocks the event loop."""
        if isinstance(config, Mapping):
            return dict(config)
        return await asyncio.to_thread(load_config, config, offline=self._core.offline)

    async def resolve(self, config: ConfigLike, **overrides: Any) -> ResolvedSpecs:
        """See `Client.resolve`."""
        config = await self._read_config(config)
        return await self._run(self._core.resolve(config, overrides))

    async def tables_for_model(
        self, config: ConfigLike, *, device: str | None = None, **overrides: Any
    ) -> dict[str, Tables]:
        """See `Client.tables_for_model`."""
        config = await self._read_config(config)
        return await self._run(self._core.tables_for_model(config, overrides, device))

    async def presets(self) -> list[Preset]:
        """See `Client.presets`."""
        return await self._run(self._core.presets())

    async def preset(self, name: str) -> Preset:
        """See `Client.preset`."""
        return await self._run(self._core.preset(name))

    async def preset_tables(self, name: str) -> dict[str, Tables]:
        """See `Client.preset_tables`."""
        return await self._run(self._core.preset_tables(name))

    async def mrope_position_ids(
        self,
        layout: Sequence[Mapping[str, Any]],
        *,
        model_type: str | None = None,
        config: ConfigLike | None = None,
        spatial_merge_size: int | None = None,
        tokens_per_second: float | None = None,
        temporal_merge_size: int | None = None,
        position_id_per_seconds: float | None = None,
    ) -> MRopePositions:
        """See `Client.mrope_position_ids`."""
        options = {
            "spatial_merge_size": spatial_merge_size,
            "tokens_per_second": tokens_per_second,
            "temporal_merge_size": temporal_merge_size,
            "position_id_per_seconds": position_id_per_seconds,
        }
        if config is not None:
            config = await self._read_config(config)
        return await self._run(self._core.mrope_position_ids(layout, model_type, config, options))

    async def kinds(self) -> list[JSON]:
        """See `Client.kinds`."""
        return await self._run(self._core.kinds())

    async def onnx(
        self, spec: Mapping[str, Any], *, graph: str, **options: Unpack[OnnxOptions]
    ) -> OnnxModel:
        """See `Client.onnx`."""
        return await self._run(self._core.onnx(spec, graph, options))

    async def ready(self) -> bool:
        """See `Client.ready`."""
        return await self._run(self._core.ready())
