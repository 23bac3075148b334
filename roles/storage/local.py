"""Files written whole on the local disk."""

from __future__ import annotations

import os
from pathlib import Path


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
