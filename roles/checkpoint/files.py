"""The files of whole-job checkpoints (no sockets): ``runs/<run>/checkpoints/``.

- ``<number>/`` (six digits) holds the parts of checkpoint ``number``: ``dense.npz`` (the
  aggregator's weights, round, generation, step count and, in sync mode step, its Adam state),
  ``ps-<i>.npz`` (a shard's whole table) or ``ps-<i>.delta.npz`` (the rows changed since the
  shard's previous file, and the keys it dropped), ``feeder-<i>/`` (the feeder's ack log as
  it stood at the cut), ``transform.json`` (the dense transform), ``control-state.json`` and
  ``control-history.json`` (control's records at the cut), ``job.toml``;
- ``<number>/manifest.json``, written last (atomically, fsynced): the parts, each with the files
  a restore reads (a shard's from its last full file on, possibly in older directories) and
  their sizes. A checkpoint without a manifest, or whose files are not all there with those
  sizes, is incomplete and never used;
- ``LATEST``: the name of the newest complete checkpoint (written after its manifest), for a
  serving system that follows the job (``zbus-predict RUN_DIR/checkpoints`` reads it).

Every file is written to a temporary name, fsynced, renamed and its directory fsynced: a file
under its final name is whole, also after the machine loses power.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from roles.job.rundir import atomic_write

CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
LATEST = "LATEST"
CHECKPOINT_FORMAT = 1


def checkpoints_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / CHECKPOINTS


def checkpoint_dir(run_dir: Path | str, number: int) -> Path:
    return checkpoints_dir(run_dir) / f"{number:06d}"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path(path: Path, pid: int) -> Path:
    """Where process ``pid`` writes ``path`` (``save_npz``) before renaming it."""
    return path.with_name(f".{path.name}.{pid}.tmp")


def save_npz(path: Path, **arrays: np.ndarray) -> int:
    """Write arrays as ``.npz`` straight to a temporary file (no copy of them in memory),
    fsync, rename, fsync the directory; the bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path, os.getpid())
    with open(tmp, "wb") as f:
        # allow_pickle given, as its default: else mypy checks the arrays against it too
        np.savez(f, allow_pickle=True, **arrays)
        f.flush()
        os.fsync(f.fileno())
        size = f.tell()
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return size


def save_file(path: Path, data: bytes) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data, durable=True)
    return len(data)


def meta_array(meta: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(orjson.dumps(meta), dtype=np.uint8)


def read_meta(f: Any) -> dict[str, Any]:
    """The ``meta`` entry of an opened ``.npz``."""
    return dict(orjson.loads(f["meta"].tobytes()))


# -- manifests -----------------------------------------------------------------------------------
def write_manifest(run_dir: Path, number: int, manifest: dict[str, Any]) -> None:
    """The checkpoint is complete from here on; LATEST names it."""
    where = checkpoint_dir(run_dir, number)
    sizes = {}
    for files in manifest["parts"].values():
        for name in files:
            sizes[name] = (checkpoints_dir(run_dir) / name).stat().st_size
    body = {"format": CHECKPOINT_FORMAT, "number": number, "created": time.time(),
            **manifest, "sizes": sizes}
    save_file(where / MANIFEST, orjson.dumps(body, option=orjson.OPT_INDENT_2))
    save_file(checkpoints_dir(run_dir) / LATEST, where.name.encode())


def read_manifest(where: Path) -> dict[str, Any] | None:
    """The manifest of a complete checkpoint directory, else None (none, unreadable, or a
    file it lists missing or of another size)."""
    try:
        manifest = orjson.loads((where / MANIFEST).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
        return None
    root = where.parent
    for name, size in manifest.get("sizes", {}).items():
        try:
            if (root / name).stat().st_size != size:
                return None
        except OSError:
            return None
    return manifest


def numbers_on_disk(run_dir: Path) -> list[int]:
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())


def latest_complete(run_dir: Path) -> tuple[int, Path, dict[str, Any]] | None:
    """(number, directory, manifest) of the newest complete checkpoint, or None."""
    for number in reversed(numbers_on_disk(run_dir)):
        where = checkpoint_dir(run_dir, number)
        manifest = read_manifest(where)
        if manifest is not None:
            return number, where, manifest
    return None


def prune(run_dir: Path, keep: int) -> list[int]:
    """Remove the checkpoints older than the newest complete one that neither are among the
    ``keep`` newest complete ones nor hold a file those read (a shard's earlier full or
    incremental file); the numbers removed."""
    complete = [(n, m) for n in numbers_on_disk(run_dir)
                if (m := read_manifest(checkpoint_dir(run_dir, n))) is not None]
    if not complete:
        return []
    kept = complete[-max(1, keep):]
    newest = kept[-1][0]
    needed = {n for n, _ in kept}
    for _, manifest in kept:
        for files in manifest["parts"].values():
            needed.update(int(name.split("/")[0]) for name in files)
    removed = []
    for n in numbers_on_disk(run_dir):
        if n < newest and n not in needed:
            shutil.rmtree(checkpoint_dir(run_dir, n), ignore_errors=True)
            removed.append(n)
    return removed
