"""The command line shared by every role: ``zbus-<role> [--job FILE] [--index N]``."""

from __future__ import annotations

import argparse
import gc
import hashlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import psutil

from roles.job.network_file import with_network_file
from roles.job.settings import Job, JobError, load_job
from roles.job.starting import make_role
from zbus.heap import keep_heap
from zbus.logs import setup_logging
from zbus.node import install_signals
from zbus.unstarted import CANNOT_START

MAX_WORKERS = 255
SLOWED_ROLES = {"worker": "per batch (idling)", "ps": "per piece of work (resting)"}


def integer(text: str) -> int:
    """An argparse type: an integer, or the error says so."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def parse_role_args(role: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"zbus-{role}", description=f"Run one zbus {role}.")
    parser.add_argument("--job", help="job file (default: $ZBUS_JOB, else the built-in job)")
    parser.add_argument("--index", type=integer, default=0,
                        help="which one of its role (an integer from 0)")
    if role == "control":
        parser.add_argument("--resume", nargs="?", const="latest",
                            default=os.environ.get("ZBUS_RESUME", ""), metavar="RUN_DIR",
                            help="go on with a run whose control died, or whose every "
                                 "process died (it goes back to its newest complete "
                                 "checkpoint): RUN_DIR, else $ZBUS_RUN_DIR, else the job's "
                                 "newest run under runs/ (default: $ZBUS_RESUME, where "
                                 "'latest' or 1 means the same as no RUN_DIR)")
    if role in SLOWED_ROLES:
        parser.add_argument("--slowdown", type=float, default=1.0, metavar="N",
                            help=f"test and demo aid: take N times as long {SLOWED_ROLES[role]}")
    return parser.parse_args(argv)


SAID_FOR_S = 60.0   # a job error said by a sibling this recently is not said again


def first_to_say(message: str) -> bool:
    """True for the first of the processes ``honcho start`` started (honcho names each in
    ``HONCHO_PROCESS_NAME`` and starts it from a process of its own: they share honcho's pid as
    their grandparent) to report ``message``: the others exit quietly with the same status. A
    process not started by honcho always says."""
    if not os.environ.get("HONCHO_PROCESS_NAME"):
        return True
    try:
        honcho = psutil.Process(os.getppid()).ppid()
    except psutil.Error:
        return True
    digest = hashlib.sha256(message.encode()).hexdigest()[:16]
    marker = os.path.join(tempfile.gettempdir(), f"zbus-said-{honcho}-{digest}")
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        try:
            if time.time() - os.stat(marker).st_mtime < SAID_FOR_S:
                return False
            os.utime(marker)   # said long ago: a new start of the same supervisor
        except OSError:
            pass
        return True
    except OSError:
        return True
    os.close(fd)
    return True


def started_by_supervisor(environ: Mapping[str, str]) -> bool:
    """Whether a supervisor starts every role of the job, so that a node not yet joined is
    most likely still starting: ``honcho start`` (it names each process in
    ``HONCHO_PROCESS_NAME``), or any other that sets ``ZBUS_SUPERVISED=1``."""
    return bool(environ.get("HONCHO_PROCESS_NAME")) or environ.get("ZBUS_SUPERVISED") == "1"


def load_job_or_exit(path: str | None, who: str) -> Job:
    """The job, or one clear line on stderr and exit status 2 (no traceback); under one
    supervisor the line is said once (``first_to_say``)."""
    try:
        return load_job(path)
    except JobError as exc:
        if first_to_say(f"job error: {exc}"):
            print(f"zbus {who}: job error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def count_of(job: Job, role: str) -> int:
    """How many of a role the job starts with."""
    c = job.cluster
    return {"worker": c.workers, "ps": c.shards, "aggregator": c.aggregators,
            "feeder": c.feeders,
            "member": c.workers * (c.parts - 1)}.get(role, 1)


def index_limit(job: Job, role: str) -> int:
    """Workers may join a running job under any new index; other roles are a fixed set."""
    return MAX_WORKERS if role == "worker" else count_of(job, role)


def role_main(role_cls: Any, argv: list[str] | None = None) -> None:
    role = role_cls.role
    args = parse_role_args(role, argv)
    job = load_job_or_exit(args.job, role)
    if not 0 <= args.index < index_limit(job, role):
        print(f"zbus {role}: --index {args.index} is outside 0..{index_limit(job, role) - 1} "
              f"for this job", file=sys.stderr)
        raise SystemExit(2)
    setup_logging(f"{role}-{args.index}")
    keep_heap()   # before the role allocates its buffers: zbus.heap says why
    options = {"slowdown": args.slowdown} if role in SLOWED_ROLES else {}
    try:   # the job's network file, from control when this host lacks it
        job = with_network_file(job, f"{role}-{args.index}")
    except OSError as exc:
        print(f"zbus {role}-{args.index}: cannot start: {exc}", file=sys.stderr)
        raise SystemExit(CANNOT_START) from None
    # a role that cannot start (a port in use, no CUDA device, a network that cannot run)
    # says why in one line and tells control, whose job fails with it (roles.job.starting)
    try:
        node, failed = make_role(lambda: role_cls(job, args.index, **options), job, role,
                                 args.index)
    except OSError as exc:   # nor can it tell control (no key pair for the bus): said here only
        print(f"zbus {role}-{args.index}: cannot start: {exc}", file=sys.stderr)
        raise SystemExit(CANNOT_START) from None
    if failed and first_to_say(f"cannot start: {failed}"):
        print(f"zbus {role}-{args.index}: cannot start: {failed}", file=sys.stderr)
    # What start-up made (modules, torch's and pyarrow's objects, the job) lives as long as the
    # process: out of the collector's way, whose full collections otherwise walk it all (a
    # feeder's took 20-25 ms, holding its loop while workers waited for their grants).
    gc.freeze()
    install_signals(node)
    code = node.run()
    # Everything is closed now (sockets, the ack log; files are written unbuffered or
    # atomically). The interpreter's last garbage collection, with torch loaded, can take
    # seconds (a worker took more than 5 s, and honcho killed it): end at once.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
