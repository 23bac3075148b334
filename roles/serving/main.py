"""``zbus-serve MODEL`` / ``zbus-serve --follow RUN``: a trained model behind the Open Inference
Protocol v2 (KServe, Triton, Seldon), on HTTP.

MODEL is what ``zbus-predict`` scores with: an export, a checkpoint, a run's checkpoints
directory or its run directory (the newest complete checkpoint), local or ``s3://``. With
``--follow RUN`` the server follows a job as it trains: each newer complete checkpoint of RUN
(a run directory, its checkpoints directory, or a checkpoints prefix in an object store) is
loaded whole, then served (``roles.serving.following``); until the first one the server is
live but not ready. RUN may be control's request endpoint, ``tcp://host:port``: control says
which job and where its checkpoints are (a server on another host follows a job whose
checkpoints are in an object store); ``--keys DIR`` holds the operator's CURVE keys when the
job's bus is secured. A server that follows a job reports to its control every second (the
version served, its lag, requests/s, p50/p99), which the console lists.

Requests are scored in micro-batches: those that come while a batch is being scored go
together in the next (``--max-batch`` rows at most); ``--max-wait-ms`` more makes a row wait
that long for others while the scorer is idle (larger batches at a moderate rate, for
latency). ``--workers N`` runs N processes behind one port (each holds the model; the kernel
spreads the connections); ``/metrics`` reports them all. Binds 127.0.0.1 unless ``--host``
says otherwise; ``--port 0`` takes a free port (the line printed once serving names it).

Exits 0 on SIGTERM or Ctrl-C, 2 when the model cannot be read (one line says why).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

from roles.serving.model import ExportError

log = logging.getLogger("zbus.serve")
RESTART_PAUSE_S = 1.0   # a worker process that died is started again after this


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="zbus-serve", description=__doc__.replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="zbus-serve [options] (MODEL | --follow RUN)")
    parser.add_argument("model", metavar="MODEL", nargs="?",
                        help="an export, a checkpoint, a run's checkpoints directory or run "
                             "directory (its newest complete checkpoint); local or s3://")
    parser.add_argument("--follow", metavar="RUN",
                        help="serve RUN's newest complete checkpoint, and each newer one as "
                             "it completes (a run directory, its checkpoints directory, an "
                             "s3:// checkpoints prefix, or control's request endpoint "
                             "tcp://host:port); live, when the job publishes its parameters")
    parser.add_argument("--keys", metavar="DIR",
                        help="--follow tcp://...: the directory of the operator's CURVE keys "
                             "(console.key_secret, and control-0.key), when the job's bus is "
                             "secured")
    parser.add_argument("--host", default="127.0.0.1", help="the address to bind "
                        "(default 127.0.0.1: this host only)")
    parser.add_argument("--port", type=int, default=8080, help="default 8080; 0: any free one")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes serving behind the port (default 1)")
    parser.add_argument("--max-batch", type=int, default=1024,
                        help="rows scored together at most, and the most one request may "
                             "send (default 1024)")
    parser.add_argument("--max-wait-ms", type=float, default=0.0,
                        help="how long a row waits for others while the scorer is idle "
                             "(default 0: requests that come while it is busy are scored "
                             "together anyway)")
    parser.add_argument("--poll-ms", type=float, default=500.0,
                        help="--follow: how often the newest checkpoint is looked for "
                             "(default 500)")
    parser.add_argument("--max-rows", type=int, default=0,
                        help="a model of more embedding rows is served from disk: its rows "
                             "copied to memory-mapped files (under $TMPDIR), read as requests "
                             "need them (default 0: every row held in memory)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per process (default: the cores / --workers)")
    args = parser.parse_args(argv)
    if (args.model is None) == (args.follow is None):
        parser.error("give MODEL or --follow RUN (one of them)")
    if (args.follow or "").startswith("tcp://") and \
            not re.fullmatch(r"tcp://[^:/\s]+:\d{1,5}", args.follow):
        parser.error(f"--follow {args.follow}: control's endpoint is tcp://host:port")
    if args.keys and not (args.follow or "").startswith("tcp://"):
        parser.error("--keys goes with --follow tcp://host:port (a run directory's job file "
                     "names its keys)")
    for name in ("workers", "max_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_rows < 0:
        parser.error("--max-rows must be 0 (no bound) or more")
    if args.max_wait_ms < 0 or args.poll_ms <= 0:
        parser.error("--max-wait-ms must be 0 or more, --poll-ms more than 0")
    return args


def load(model: str, max_rows: int = 0):
    """The Served of MODEL (``ExportError`` and the like when it cannot be read)."""
    from roles.serving.model import read_model
    from roles.serving.served import Served
    return Served.of(read_model(model, max_rows))


def serve(args: argparse.Namespace, sock: socket.socket, served, threads: int) -> None:
    """One serving process: the application on ``sock`` until SIGTERM or SIGINT."""
    import torch
    import uvicorn

    from roles.serving.app import Holder, ServeApp
    from roles.serving.following import follower
    from roles.serving.metrics import ServeMetrics
    from roles.serving.reporting import Reporters

    torch.set_num_threads(threads)
    holder = Holder(served, ServeMetrics())
    host, port = sock.getsockname()[:2]
    reporters = Reporters(lambda: holder.served, holder.metrics.recent, args.keys, host, port)
    following = follower(args.follow, holder.replace, args.poll_ms / 1000, reporters.on_job,
                         args.keys, args.max_rows).start() if args.follow else None
    app = ServeApp(holder, args.max_batch, args.max_wait_ms / 1000)
    config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False,
                            http="httptools", timeout_graceful_shutdown=5)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        if following is not None:
            following.close()
        reporters.close()


def bound(host: str, port: int, shared: bool = False, listen: bool = True) -> socket.socket:
    """A TCP socket bound to (host, port); ``shared``: one of several processes' on the same
    port (SO_REUSEPORT: the kernel spreads the connections among those that listen, by each
    connection's addresses, so that no process takes them all while the others wait); not
    ``listen``ing, it only keeps the port for them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle off (TCP_NODELAY) only on connections of a
    # socket that says it is TCP; with proto 0 each response's body waited for the client's
    # delayed ACK (measured: 44 ms a request against 0.4)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)
    return sock


def supervise(args: argparse.Namespace, sock: socket.socket, served, threads: int) -> int:
    """``--workers`` processes forked from this one (the model loaded once, its pages shared
    until written), each listening on a socket of its own on ``sock``'s port (which this
    process keeps, not listening); one that dies is started again; SIGTERM or SIGINT stops
    them all."""
    from prometheus_client import multiprocess
    children: dict[int, int] = {}
    stopping = False

    def fork(slot: int) -> None:
        pid = os.fork()
        if pid == 0:   # the worker process
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            # its temporary files (a model's rows on disk, --max-rows) in a directory of its
            # slot's, emptied first: what a killed predecessor left goes (it exits with
            # os._exit, which runs no clean-up)
            mine = Path(tempfile.gettempdir()) / f"worker-{slot}"
            shutil.rmtree(mine, ignore_errors=True)
            mine.mkdir()
            tempfile.tempdir = str(mine)
            try:
                host, port = sock.getsockname()[:2]
                serve(args, bound(host, port, shared=True), served, threads)
            finally:
                os._exit(0)
        children[pid] = slot

    def stop(signum: int, _frame) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for slot in range(args.workers):
        fork(slot)
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        multiprocess.mark_process_dead(pid)
        if pid in children and not stopping:
            slot = children.pop(pid)
            log.error("zbus-serve: worker process %d ended (status %d); starting it again",
                      pid, status)
            time.sleep(RESTART_PAUSE_S)
            fork(slot)
        children.pop(pid, 0)
    return 0


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    metrics_dir = None
    if args.workers > 1:   # before prometheus_client is imported: its values live in files
        metrics_dir = tempfile.TemporaryDirectory(prefix="zbus-serve-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir.name
    # every temporary file of this process and its workers (a model copied from s3://, its
    # rows on disk past --max-rows) under one directory, removed at the end
    scratch = tempfile.TemporaryDirectory(prefix="zbus-serve-")
    before, tempfile.tempdir = tempfile.tempdir, scratch.name
    from roles.storage.fs import StorageError
    try:
        served = load(args.model, args.max_rows) if args.model else None
        sock = bound(args.host, args.port, shared=args.workers > 1, listen=args.workers == 1)
    except (ExportError, OSError, KeyError, StorageError) as exc:
        print(f"zbus-serve: {exc}", file=sys.stderr)
        tempfile.tempdir = before
        scratch.cleanup()
        raise SystemExit(2) from None
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    host, port = sock.getsockname()[:2]
    what = f"{served.signature.name} (round {served.version})" if served \
        else f"the newest checkpoint of {args.follow}"
    print(f"zbus-serve: serving {what} on http://{host}:{port} "
          f"({args.workers} process{'es' if args.workers > 1 else ''})", flush=True)
    try:
        if args.workers == 1:
            serve(args, sock, served, threads)
        else:
            supervise(args, sock, served, threads)
    finally:
        sock.close()
        tempfile.tempdir = before
        scratch.cleanup()
        if metrics_dir is not None:
            metrics_dir.cleanup()


if __name__ == "__main__":
    main()
