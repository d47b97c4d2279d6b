"""Small answers in process: thread CPU per request through the ASGI app, no socket, no uvicorn.

    python -m bench.inproc [--baseline REV] [--rounds 5] [--requests 3000]
    python -m bench.inproc --profile get      # pyinstrument's text tree (pip install pyinstrument)

On a machine shared with other work, wall-clock rates drift from one second to the next; the CPU
time of the thread serving the requests does much less. Each case calls the app (`create_app`,
lifespan started, device cpu) directly with a pre-built ASGI scope and body, after a warm-up, and
divides the thread's CPU time by the requests: what posenc and the framework spend per request,
without the server's parsing and socket writes (which `bench/floor.py` includes).

Cases: `floor` (a bare Starlette app answering 33 KiB of bytes to a GET), `get` (`GET
/v1/tables/{key}` of the 33.6 KiB table), `post` (`POST /v1/tables` of its spec), `v2` (a decode
step: one position, cos and sin binary). Every case runs in a child process (one per tree and
round, alternating); `--baseline REV` runs the same cases from `service/` of git revision REV.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import header, load, table
from bench.floor import decode_step, extract
from bench.serve import SMALL, get, post_json

CASES = ("floor", "get", "post", "v2")


def _scope(raw: bytes) -> tuple[dict[str, Any], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    method, target, _ = lines[0].split(b" ")
    path, _, query = target.partition(b"?")
    headers = [
        (k.strip().lower(), v.strip()) for k, v in (line.split(b":", 1) for line in lines[1:])
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method.decode(),
        "scheme": "http",
        "path": path.decode(),
        "raw_path": path,
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    return scope, body


async def _call(app: Any, scope: dict[str, Any], body: bytes) -> int:
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    status = 0

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(dict(scope), receive, send)
    return status


def _floor_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    data = b"x" * 34_000

    async def body(request: Request) -> Response:
        if request.method == "POST":
            await request.body()
        return Response(data, media_type="application/octet-stream")

    return Starlette(routes=[Route("/{i:int}", body, methods=["GET", "POST"])])


async def _run(case: str, requests: int, profile: bool) -> float:
    """µs of thread CPU per request of `case`."""
    from posenc.api.app import create_app
    from posenc.api.settings import Settings

    app = create_app(Settings(device="cpu", log_level="warning"))
    async with app.router.lifespan_context(app):
        scope, body = _scope(post_json("/v1/tables", SMALL))
        await _call(app, scope, body)
        from posenc.encodings import content_key, parse_spec

        key = content_key(parse_spec(SMALL))
        raw = {
            "floor": get("/0"),
            "get": get(f"/v1/tables/{key}"),
            "post": post_json("/v1/tables", SMALL),
            "v2": decode_step(SMALL, 17),
        }[case]
        target = _floor_app() if case == "floor" else app
        scope, body = _scope(raw)
        for _ in range(200):
            status = await _call(target, scope, body)
        if status != 200:
            raise RuntimeError(f"{case}: status {status}")
        profiler = None
        if profile:
            import pyinstrument  # not locked: pip install pyinstrument to profile

            profiler = pyinstrument.Profiler(interval=0.0001)
            profiler.start()
        start = time.thread_time()
        for _ in range(requests):
            await _call(target, scope, body)
        per = (time.thread_time() - start) / requests * 1e6
        if profiler is not None:
            profiler.stop()
            print(profiler.output_text(unicode=False, color=False), file=sys.stderr)
        return per


def _child(case: str, requests: int, source: Path | None) -> float:
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source), env.get("PYTHONPATH", "")]).rstrip(":")
    out = subprocess.run(
        [sys.executable, "-m", "bench.inproc", "--child", case, "--requests", str(requests)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["us"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="a git revision to measure beside this tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--profile", choices=CASES, help="print a pyinstrument profile of a case")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child or args.profile:
        per = asyncio.run(_run(args.child or args.profile, args.requests, bool(args.profile)))
        print(json.dumps({"us": per}))
        return 0
    before = load()
    scratch = Path(tempfile.mkdtemp(prefix="posenc-inproc-"))
    trees: dict[str, Path | None] = {"posenc": None}
    if args.baseline:
        trees[args.baseline] = extract(args.baseline, scratch)
    samples: dict[tuple[str, str], list[float]] = {}
    try:
        for r in range(args.rounds):
            for case in CASES:
                names = list(trees)
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    per = _child(case, args.requests, trees[name])
                    samples.setdefault((case, name), []).append(per)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    command = "python -m bench.inproc" + (f" --baseline {args.baseline}" if args.baseline else "")
    print(header(command, before))
    print(f"thread CPU per request, median of {args.rounds} rounds x {args.requests} requests")
    print()
    columns = ["case", *(f"{name} µs" for name in trees)]
    if args.baseline:
        columns.append(f"posenc / {args.baseline}")
    rows = []
    for case in CASES:
        med = {name: statistics.median(samples[(case, name)]) for name in trees}
        row = [case, *(f"{med[name]:.1f}" for name in trees)]
        if args.baseline:
            row.append(f"{med['posenc'] / med[args.baseline]:.2f}")
        rows.append(row)
    print(table(columns, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
