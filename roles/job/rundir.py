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
