"""Container health check: exit 0 when posenc on this container answers /v2/health/ready with 200.

Used by the Dockerfile's HEALTHCHECK and compose. Standard library only, so a check costs a bare
interpreter start (tens of milliseconds), not an import of torch. The port is the one the server
binds: `POSENC_PORT` (the service's own setting, default 8000), always on the loopback.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    port = os.environ.get("POSENC_PORT", "8000")
    url = f"http://127.0.0.1:{port}/v2/health/ready"
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"posenc not ready at {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
