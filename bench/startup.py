"""Time to live and to ready of `posenc serve`, with no presets, the deployed ones and all.

    python -m bench.startup [--quick] [--rounds 3] [--device cpu]

Each run spawns `posenc serve --device <device>` and polls `/v2/health/live` and
`/v2/health/ready` every 5 ms from the moment the process is started: live is the app answering
(Python, torch and the app imported, the lifespan started), ready is every warm preset computed
(`--warm-presets`; readiness waits for them). Configurations:

- none: `POSENC_WARM_PRESETS` unset (the default setting);
- deployed: the Kubernetes base's `POSENC_WARM_PRESETS` (deploy/k8s/base/configmap.yaml);
- all: every shipped preset.

Rounds alternate the configurations; medians are reported, with the server's RSS once ready.
`python -c "import torch"` and `python -c "import posenc.api.app"` are timed alike, for scale. On a
machine with CUDA, `--device cuda` measures the GPU server (device initialisation included).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench._common import header, load, mib, ms, table
from bench.scale import rss
from bench.serve import Conn, free_port, get

CONFIGMAP = Path(__file__).resolve().parent.parent / "deploy" / "k8s" / "base" / "configmap.yaml"


def deployed_presets() -> str:
    """The comma list the Kubernetes base warms (empty when the file or key is missing)."""
    try:
        text = CONFIGMAP.read_text()
    except OSError:
        return ""
    match = re.search(r'POSENC_WARM_PRESETS:\s*"([^"]*)"', text)
    return match.group(1) if match else ""


def status(port: int, path: str) -> int | None:
    try:
        conn = Conn(port, 1 << 16)
        code, _ = conn.request(get(path))
        conn.close()
        return code
    except OSError:
        return None


def run(device: str, presets: str) -> tuple[float, float, int]:
    """(seconds to live, seconds to ready, RSS at ready) of one server start."""
    port = free_port()
    exe = Path(sys.executable).with_name("posenc")
    args = [str(exe), "serve", "--port", str(port), "--device", device, "--log-level", "warning"]
    if presets:
        args += ["--warm-presets", presets]
    start = time.perf_counter()
    proc = subprocess.Popen(args)
    live = ready = None
    try:
        while ready is None:
            if proc.poll() is not None:
                raise RuntimeError(f"posenc serve exited with {proc.returncode}")
            if time.perf_counter() - start > 600:
                raise RuntimeError("not ready after 600 s")
            if live is None and status(port, "/v2/health/live") == 200:
                live = time.perf_counter() - start
            if live is not None and status(port, "/v2/health/ready") == 200:
                ready = time.perf_counter() - start
            time.sleep(0.005)
        memory = rss(proc.pid)[0]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert live is not None
    return live, ready, memory


def import_time(module: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians)")
    parser.add_argument("--device", default="cpu", help="the server's --device")
    args = parser.parse_args(argv)
    before = load()
    rounds = 1 if args.quick else args.rounds
    deployed = deployed_presets()
    configs = {"none": "", f"deployed ({deployed or 'none'})": deployed, "all": "all"}
    samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in configs}
    imports: dict[str, list[float]] = {"torch": [], "posenc.api.app": []}
    names = list(configs)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(run(args.device, configs[name]))
            live, ready, memory = samples[name][-1]
            print(
                f"  {name:40s} live {ms(live)} ms ready {ms(ready)} ms RSS {mib(memory)}",
                file=sys.stderr,
                flush=True,
            )
        for module in imports:
            imports[module].append(import_time(module))
    command = "python -m bench.startup" + (" --quick" if args.quick else "")
    command += f" --device {args.device}" if args.device != "cpu" else ""
    print(header(command, before))
    print()
    rows = []
    for name, values in samples.items():
        live = statistics.median(v[0] for v in values)
        ready = statistics.median(v[1] for v in values)
        memory = statistics.median(v[2] for v in values)
        rows.append([name, ms(live), ms(ready), mib(memory)])
    for module, values in imports.items():
        rows.append(
            [f"`python -c 'import {module}'` (for scale)", ms(statistics.median(values)), "-", "-"]
        )
    print(f"Server device {args.device}; median of {rounds} alternating rounds:")
    print()
    print(table(["warm presets", "to live, ms", "to ready, ms", "RSS at ready"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
