"""The files a run leaves in ``runs/<name>-<timestamp>/`` (or ``ZBUS_RUN_DIR``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson


def make_run_dir(name: str, environ: dict | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("ZBUS_RUN_DIR"):
        path = Path(env["ZBUS_RUN_DIR"])
        path.mkdir(parents=True, exist_ok=True)
        return path.absolute()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        path = Path("runs") / (f"{name}-{stamp}" + (f"-{n}" if n else ""))
        try:
            path.mkdir(parents=True)
            return path.absolute()
        except FileExistsError:
            continue
    raise OSError(f"cannot make a run directory for {name} under runs/")


def shown(path: str | Path) -> str:
    """A run's path as a user reads it: relative to the working directory when it lies below
    it (runs/...), else absolute (not ../../tmp/...)."""
    relative = os.path.relpath(path)
    return os.path.abspath(path) if relative.startswith("..") else relative


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Write, fsync, rename: a reader sees the old file or the whole new one. The temporary
    file is the writer's own (its pid), so that processes writing the same file (feeders
    exporting the same transform) do not rename each other's. ``durable=False`` skips the
    fsyncs: the file then survives the writer being killed, not the machine losing power."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class MetricsLog:
    """metrics.jsonl: one JSON object per line, each with ``event`` and ``t`` (seconds)."""

    def __init__(self, path: Path):
        self.path = path
        self._f = open(path, "ab")
        self._t0 = time.monotonic()

    def write(self, event: str, **fields: Any) -> None:
        line = {"event": event, "t": round(time.monotonic() - self._t0, 3), **fields}
        self._f.write(orjson.dumps(line, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()
