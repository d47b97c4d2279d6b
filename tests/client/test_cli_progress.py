"""posenc-client's progress display (tqdm) through the console script on a real terminal (a
pseudo-terminal as its stderr) against the real server: a download bar with the size from
Content-Length, rate and ETA, redrawn a bounded number of times for a large table; a spinner while
the server has not answered (a real TCP relay in front of the server holds its answer back);
nothing with --quiet or when stderr is not a terminal."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from posenc_client import Tables
from tests.conftest import ServerHandle

CLI = Path(sys.executable).with_name("posenc-client")
MININTERVAL = 0.2  # DownloadProgress's default: at most one redraw per 0.2 s
ROWS = 131072  # rope head_dim=128: cos and sin of 131072 x 128 float32, 128 MiB


def run_on_terminal(*args: str, timeout: float = 300.0) -> tuple[int, str, str, float]:
    """Run the console script with a pseudo-terminal as stderr: (exit code, stdout, what the
    terminal showed, wall seconds)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 120 columns
    start = time.monotonic()
    proc = subprocess.Popen([str(CLI), *args], stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    shown = bytearray()
    deadline = start + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: the process ended
                break
            if not chunk:
                break
            shown += chunk
        elif proc.poll() is not None:
            break
    out = proc.communicate(timeout=60)[0]
    wall = time.monotonic() - start
    os.close(master)
    return proc.returncode, out, shown.decode("utf-8", "replace"), wall


def redraws(shown: str) -> int:
    """How many times tqdm drew a line: each draw starts with a carriage return."""
    return shown.count("\r")


def test_download_bar_rate_eta_and_bounded_redraws(server: ServerHandle, tmp_path: Path) -> None:
    out = tmp_path / "rope.safetensors"
    code, _, shown, wall = run_on_terminal(
        "--url", server.url, "--no-cache", "fetch", "rope", "head_dim=128",
        f"max_positions={ROWS}", "-o", str(out),
    )  # fmt: skip
    assert code == 0, shown
    size = out.stat().st_size
    assert size > 128 << 20
    assert Tables.from_safetensors(out.read_bytes())["cos"].shape == (ROWS, 128)
    assert "downloading" in shown
    assert "100%" in shown
    total = f"{size / 1e6:.0f}M"  # tqdm's decimal unit scale: the Content-Length as MB
    assert re.search(rf"/{total}B? ", shown) or f"/{total}" in shown, shown[-400:]
    assert re.search(r"[0-9.]+[kMG]?B/s", shown), shown[-400:]  # the rate
    assert re.search(r"<\d\d:\d\d", shown), shown[-400:]  # the ETA
    # thousands of chunks, a redraw at most every MININTERVAL of the process's whole life
    chunks = size // 65536
    assert redraws(shown) <= wall / MININTERVAL + 4, (redraws(shown), wall)
    assert redraws(shown) < chunks / 20


class HoldingRelay:
    """A TCP relay to the server that holds each answer back `hold` seconds before passing it
    on: a server slow to send its first byte, as one computing a large table is."""

    def __init__(self, upstream: str, hold: float) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.hold = hold
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream) as server:

            def pipe(src: socket.socket, dst: socket.socket, hold: float) -> None:
                held = False
                try:
                    while data := src.recv(65536):
                        if not held:
                            time.sleep(hold)
                            held = True
                        dst.sendall(data)
                except OSError:
                    pass
                finally:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)

            back = threading.Thread(target=pipe, args=(server, client, self.hold), daemon=True)
            back.start()
            pipe(client, server, 0.0)
            back.join()

    def close(self) -> None:
        self.closed = True
        self.sock.close()


@pytest.fixture
def slow_server(server: ServerHandle) -> Iterator[str]:
    relay = HoldingRelay(server.url, hold=1.5)
    yield relay.url
    relay.close()


def test_spinner_while_the_server_has_not_answered(slow_server: str, tmp_path: Path) -> None:
    code, stdout, shown, _ = run_on_terminal(
        "--url", slow_server, "--no-cache", "fetch", "alibi", "num_heads=4"
    )
    assert code == 0, shown
    assert '"kind": "alibi"' in stdout
    assert "waiting for the server (computing)" in shown
    spins = re.findall(r"\(computing\) ([|/\\-]) (\d+\.\d)s", shown)
    assert len({char for char, _ in spins}) >= 2  # it turns
    assert max(float(t) for _, t in spins) >= 1.0  # and counts the wait
    assert len(spins) <= 1.5 / MININTERVAL + 3  # bounded like the bar
    assert "downloading" not in shown  # a small body: no bar


def test_quiet_and_not_a_terminal(slow_server: str, server: ServerHandle) -> None:
    code, _, shown, _ = run_on_terminal("--url", slow_server, "--no-cache", "-q", "fetch",
                                        "alibi", "num_heads=4")  # fmt: skip
    assert code == 0, shown
    assert shown == ""
    done = subprocess.run(
        [str(CLI), "--url", server.url, "--no-cache", "fetch", "rope", "head_dim=128",
         "max_positions=16384"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # stderr is a pipe: no bar
