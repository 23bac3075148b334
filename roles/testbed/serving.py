"""``zbus-serve``'s application on a real loopback port, on a thread of this process
(``ServerThread``): a test speaks HTTP to it as to the process, without starting one. What
only the process can show (workers behind one port, a worker killed, exit statuses) the
tests show with ``zbus-serve`` itself."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import uvicorn

from roles.data.index import index_files, plan_parts, resolve_paths
from roles.data.readers import read_part
from roles.data.stream import Preparer, Tally, eval_batches
from roles.serving.app import Holder, ServeApp
from roles.serving.following import follower
from roles.serving.main import bound
from roles.serving.metrics import ServeMetrics
from roles.serving.model import ExportedModel
from roles.serving.reporting import Reporters
from roles.serving.served import Served
from roles.tools.predict import schema_of


class ServerThread:
    """Serves ``served`` (or follows ``follow``, a run directory or control's endpoint, and
    reports to its control as ``zbus-serve`` does) until ``close``."""

    def __init__(self, served: Served | None = None, follow: str | None = None,
                 max_batch: int = 1024, max_wait_s: float = 0.0, poll_s: float = 0.1,
                 keys_dir: str | None = None, max_rows: int = 0):
        self.holder = Holder(served, ServeMetrics())
        self.sock = bound("127.0.0.1", 0)
        port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.reporters = Reporters(lambda: self.holder.served, self.holder.metrics.recent,
                                   keys_dir, "127.0.0.1", port)
        self.follower = follower(follow, self.holder.replace, poll_s, self.reporters.on_job,
                                 keys_dir, max_rows).start() if follow else None
        self.app = ServeApp(self.holder, max_batch, max_wait_s)
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
        self.reporters.close()
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def predicted(model: ExportedModel, path: Path, fmt: str = "csv") -> np.ndarray:
    """What ``zbus-predict`` computes for the file's rows (``roles.tools.predict.predict``,
    at full precision: its output file rounds them)."""
    files = index_files(resolve_paths(str(path), fmt, "DATA"), fmt)
    parts, _ = plan_parts(files, 0.0, model.job.data.part_mb)
    prepare = Preparer(model.job.layout(), model.transform, None)
    out = [model.score(b.keys, b.dense)
           for p in parts for b in eval_batches(read_part(files, p, fmt,
                                                          schema_of(model.job, True)),
                                                prepare, Tally(), 65_536)]
    return np.concatenate(out)
