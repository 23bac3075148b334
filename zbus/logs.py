"""Logging set-up for role processes: one line per record on stderr, tagged with the node id
(honcho adds the time and the process name), and the same lines, with the time, in the run
directory's ``logs/<node>.log`` once the role knows its run (``to_run_dir``: control at
start, a node at control's Welcome), so that a job can be followed without its supervisor
(``tail -F``). The lines logged before that are kept (the newest ``EARLY_KEPT``) and written
to the file first. A file is bounded: past ``FILE_BYTES`` it becomes ``<node>.log.1`` (the one
before is dropped) and a new one begins.

A process that runs several nodes (``roles.tools.in_process``) says which one is at work
(``node_scope``); each node's file then takes only that node's lines (``OfNode``), and the
lines of no node in particular (another thread's) go to every file."""

from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import logging.handlers
import os
from collections.abc import Iterator
from pathlib import Path

EARLY_KEPT = 1000           # lines logged before the run directory is known, kept for the file
FILE_BYTES = 64 * 1024**2   # a log file's size before it is rotated (one older file is kept)
LOGS = "logs"               # the run directory's folder of role logs


_at_work: contextvars.ContextVar[str | None] = contextvars.ContextVar("zbus_node", default=None)


@contextlib.contextmanager
def node_scope(node_id: str) -> Iterator[None]:
    """The lines logged meanwhile are ``node_id``'s (a process running several nodes)."""
    token = _at_work.set(node_id)
    try:
        yield
    finally:
        _at_work.reset(token)


class OfNode(logging.Filter):
    """Passes the lines of one node, and those logged outside any ``node_scope``."""

    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def filter(self, record: logging.LogRecord) -> bool:
        at_work = _at_work.get()
        return at_work is None or at_work == self.node_id


def line_format(node_id: str, with_time: bool = False) -> logging.Formatter:
    """A role's log line: ``LEVEL [node] logger: message``, after the time in a file."""
    return FileFormat(("%(asctime)s " if with_time else "")
                      + f"%(levelname)s [{node_id}] %(name)s: %(message)s", with_time)


class Early(logging.Handler):
    """The records logged before the run directory is known (the newest EARLY_KEPT)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: collections.deque[logging.LogRecord] = collections.deque(maxlen=EARLY_KEPT)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def setup_logging(node_id: str) -> None:
    level = os.environ.get("ZBUS_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO), force=True)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(line_format(node_id))
    logging.getLogger().addHandler(Early())


def log_path(run_dir: Path | str, node_id: str) -> Path:
    return Path(run_dir) / LOGS / f"{node_id}.log"


def to_run_dir(run_dir: Path | str, node_id: str) -> Path | None:
    """From now on log to ``logs/<node_id>.log`` under ``run_dir`` too (appended to: a process
    started again goes on in its predecessor's file), beginning with the lines logged so far;
    the file's path (None when it cannot be opened: the role logs to stderr only, and says so
    there)."""
    root = logging.getLogger()
    early = next((h for h in root.handlers if isinstance(h, Early)), None)
    path = log_path(run_dir, node_id)
    if any(isinstance(h, logging.FileHandler) and h.baseFilename == str(path.absolute())
           for h in root.handlers):
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=FILE_BYTES, backupCount=1,
                                                       encoding="utf-8")
    except OSError as exc:
        logging.getLogger(__name__).warning("%s: cannot write its log to %s (%s); logging to "
                                            "stderr only", node_id, path, exc.strerror or exc)
        return None
    handler.setFormatter(line_format(node_id, with_time=True))
    handler.addFilter(OfNode(node_id))
    if early is not None:
        root.removeHandler(early)
        for record in early.records:
            handler.handle(record)
    root.addHandler(handler)
    return path


class FileFormat(logging.Formatter):
    """A log line: the time (in a file), then the line as stderr shows it (a printed line as
    it was printed)."""

    def __init__(self, fmt: str, with_time: bool = True) -> None:
        super().__init__(fmt)
        self.with_time = with_time

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "printed", False):
            said = record.getMessage()
            return f"{self.formatTime(record)} {said}" if self.with_time else said
        return super().format(record)


def to_file(text: str) -> None:
    """Lines a role printed (control's closing summary lines) into its log file as well."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.handlers.RotatingFileHandler):  # (its filters apply)
            for line in text.splitlines():
                handler.handle(logging.makeLogRecord({"msg": line, "printed": True}))
