"""``zbus-serve``'s application on a real loopback port, on a thread of this process
(``ServerThread``): a test speaks HTTP to it as to the process, without starting one. What
only the process can show (workers behind one port, a worker killed, exit statuses) the
tests show with ``zbus-serve`` itself."""

from __future__ import annotations

import threading
import time

import uvicorn

from roles.serving.app import Holder, ServeApp
from roles.serving.following import Follower
from roles.serving.main import bound
from roles.serving.metrics import ServeMetrics
from roles.serving.served import Served


class ServerThread:
    """Serves ``served`` (or follows ``follow``, a run directory) until ``close``."""

    def __init__(self, served: Served | None = None, follow: str | None = None,
                 max_batch: int = 1024, max_wait_s: float = 0.0, poll_s: float = 0.1):
        self.holder = Holder(served, ServeMetrics())
        self.follower = Follower(follow, self.holder.replace, poll_s).start() if follow \
            else None
        self.app = ServeApp(self.holder, max_batch, max_wait_s)
        self.sock = bound("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, lifespan="on",
                                                    log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="zbus-serve-test", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the server did not start")
            time.sleep(0.01)

    def close(self) -> None:
        if self.follower is not None:
            self.follower.close()
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
