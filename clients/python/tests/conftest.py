"""Test support: the real livegate binary on 127.0.0.1 with a temp data dir, started and
restarted (also after `kill -9`) on the same port; a poll helper (no fixed sleeps).

The binary is $LIVEGATE_BIN, else the repository's target/release/livegate.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
BINARY = os.environ.get("LIVEGATE_BIN") or str(REPO / "target/release/livegate")
API_KEY = "test-api-key-0123456789"


class Server:
    """A `livegate serve` process: `url` once listening; `kill()` (SIGKILL) and `start()`
    again on the same port and data dir."""

    def __init__(self, data_dir: str, env: dict[str, str] | None = None, args: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.env = env or {}
        self.args = args or []
        self.port = 0
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = os.path.join(data_dir, "..", f"{os.path.basename(data_dir)}.stderr.log")

    def start(self, within: float = 15.0) -> Server:
        """Starts it (on the port it had, when it had one: retried while that port is not
        free yet), waits for its `listening on http://ADDR` line, then until it takes
        connections (`/readyz` past `starting`: a handshake before the directory is
        reconciled is refused unspent, and a client would mint a second token)."""
        deadline = time.monotonic() + within
        while True:
            try:
                self._start_once(deadline)
                return self
            except RuntimeError:
                if self.port == 0 or time.monotonic() > deadline:
                    raise

    def _start_once(self, deadline: float) -> None:
        if not os.path.exists(BINARY):
            raise RuntimeError(f"{BINARY} is missing: build it (cargo build --release) or set LIVEGATE_BIN")
        log = open(self.log_path, "a")
        proc = subprocess.Popen(
            [
                BINARY, "serve",
                "--listen", f"127.0.0.1:{self.port}",
                "--data-dir", self.data_dir,
                "--api-key", API_KEY,
                "--drain-wait-secs", "0",
                "--drain-spread-secs", "1",
                "--drain-grace-secs", "3",
                *self.args,
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info"), **self.env},
        )
        log.close()
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"livegate did not start in time\n{self.stderr()}")
            if line is None:
                proc.wait()
                raise RuntimeError(f"livegate exited ({proc.returncode}) before listening\n{self.stderr()}")
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                self.url = match.group(1)
                self.port = int(self.url.rsplit(":", 1)[1])
                self.proc = proc
                self._wait_taking_connections(deadline)
                return

    def _wait_taking_connections(self, deadline: float) -> None:
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as refusal:
                if b"joining" in refusal.read():
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"livegate did not take connections in time\n{self.stderr()}")
            time.sleep(0.02)  # a poll of /readyz, bounded by the start's deadline

    def stderr(self) -> str:
        try:
            return Path(self.log_path).read_text()[-20_000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no drain, no flush beyond what was durable."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM and wait (SIGKILL after 10 s)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def data_dir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="livegate-py-") as root:
        path = os.path.join(root, "data")
        os.mkdir(path)
        yield path


@pytest.fixture
def server(data_dir: str) -> Iterator[Server]:
    srv = Server(data_dir).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def start_server(data_dir: str) -> Iterator[Callable[..., Server]]:
    """Starts a server with extra env/args (each one stopped at the end)."""
    started: list[Server] = []

    def start(env: dict[str, str] | None = None, args: list[str] | None = None) -> Server:
        srv = Server(data_dir, env=env, args=args).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


async def wait_for(check: Callable[[], Any | Awaitable[Any]], what: str, within: float = 15.0, every: float = 0.02) -> Any:
    """Polls `check` until it returns something truthy (returned), failing after `within` s."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(every)  # poll interval of a condition wait


NATS_SERVER = os.environ.get("NATS_SERVER_BIN", "/usr/sbin/nats-server")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Nats:
    """`nats-server -js` on loopback with its store in a temp dir."""

    def __init__(self, store: str) -> None:
        for _ in range(3):
            port = free_port()
            proc = subprocess.Popen(
                [NATS_SERVER, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", store],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            lines: queue.Queue[str | None] = queue.Queue()

            def read(p: subprocess.Popen[str] = proc, out: queue.Queue[str | None] = lines) -> None:
                assert p.stdout is not None
                for line in p.stdout:
                    out.put(line)
                out.put(None)

            threading.Thread(target=read, daemon=True).start()
            deadline = time.monotonic() + 10
            while True:
                try:
                    line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    line = None
                if line is None:
                    proc.kill()
                    proc.wait()
                    break
                if "Server is ready" in line:
                    self.proc = proc
                    self.url = f"nats://127.0.0.1:{port}"
                    return
        raise RuntimeError("nats-server did not start")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Forwarder:
    """A TCP forwarder on 127.0.0.1 (the load balancer a client is given): `point(port)`
    chooses where new connections go, `drop_all()` cuts the forwarded ones, `hold()` resets
    new ones until `release()`; `accepted` counts those forwarded."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.held = False
        self.accepted = 0
        self.port = 0
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Forwarder:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.held:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        self.accepted += 1
        pair = (writer, up_writer)
        self._pairs.add(pair)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._pairs.discard(pair)

    def point(self, port: int) -> None:
        self.target = port

    def hold(self) -> None:
        self.held = True

    def release(self) -> None:
        self.held = False

    def drop_all(self) -> None:
        for client, upstream in list(self._pairs):
            client.transport.abort()
            upstream.transport.abort()
        self._pairs.clear()

    async def close(self) -> None:
        self.drop_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
