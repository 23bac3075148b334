"""Files written whole on the local disk: under a temporary name, then renamed into place, so
that a reader, or a process started after a crash, sees the old file or the whole new one. Every
file a role or the transport (its health file) writes that way goes through ``atomic_file``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def temp_path(path: Path, pid: int) -> Path:
    """Where process ``pid`` writes ``path`` before renaming it into place."""
    return path.with_name(f".{path.name}.{pid}.tmp")


def temp_glob(name: str) -> str:
    """The glob of every process's temporary files for file ``name`` (``temp_path``)."""
    return f".{name}.*.tmp"


@contextmanager
def atomic_file(path: Path, durable: bool = True) -> Iterator[BinaryIO]:
    """A file to write ``path`` through: written under a temporary name, then fsynced, renamed
    and its directory fsynced when the block ends, so that a reader sees the old file or the
    whole new one. When the block raises, the temporary file is removed and ``path`` is left as
    it was. The temporary file is the writer's own (its pid), so that processes writing the
    same file (feeders exporting the same transform) do not rename each other's.
    ``durable=False`` skips the fsyncs: the file then survives the writer being killed, not
    the machine losing power."""
    tmp = temp_path(path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Write, fsync, rename (``atomic_file``): a reader sees the old file or the whole new
    one."""
    with atomic_file(path, durable) as f:
        f.write(data)
