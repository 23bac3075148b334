"""The files of whole-job checkpoints (no sockets): ``[checkpoint] dir``, a local directory or
an ``s3://`` prefix (``roles.storage.store``), by default ``runs/<run>/checkpoints/``.

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
  serving system that follows the job (``zbus-predict RUN_DIR/checkpoints`` reads it);
- ``summary.json`` with ``[checkpoint] dir`` set: the run's summary once it ended (its
  ``resume_from`` says whether it can be resumed), for a control whose run directory is gone;
- with ``[checkpoint] dir`` set, what a role of the running job keeps there because its pod's
  disk may be gone when it is started again: ``acks/feeder-<i>.json``, each feeder's ack log
  in its compact form (``roles.checkpoint.stored_acks``), and ``control/``, control's records
  handed over when its pod was stopped (``roles.control.handover``). A new run removes both.

Every file is written to a temporary name, fsynced, renamed and its directory fsynced: a file
under its final name is whole, also after the machine loses power. In an object store, which
has no rename, each part is staged in the run directory and uploaded (an object exists only
once whole); the manifest, then ``LATEST``, are written after every file they list is there,
so a checkpoint interrupted between its data and its manifest is never used either.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from roles.storage.fs import StorageError
from roles.storage.store import Store, basename, parent
from zbus.files import atomic_file, atomic_write

if TYPE_CHECKING:
    from roles.job.settings import Job

CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
LATEST = "LATEST"
SUMMARY = "summary.json"   # with [checkpoint] dir: the run's summary when it ended, beside them
ACKS = "acks"              # ... the feeders' ack logs, compact (roles.checkpoint.stored_acks)
HANDOVER = "control"       # ... control's records when its pod was stopped (control.handover)
CHECKPOINT_FORMAT = 1


def checkpoints_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / CHECKPOINTS


def checkpoint_dir(run_dir: Path | str, number: int) -> Path:
    return checkpoints_dir(run_dir) / f"{number:06d}"


def save_npz(path: Path, **arrays: np.ndarray) -> int:
    """Write arrays as ``.npz`` straight to a temporary file (no copy of them in memory),
    fsync, rename, fsync the directory; the bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        # allow_pickle given, as its default: else mypy checks the arrays against it too
        np.savez(f, allow_pickle=True, **arrays)
        size = f.tell()
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


# -- the store ---------------------------------------------------------------------------------
def checkpoint_store(job: Job, run_dir: Path | str) -> Store:
    """Where the job's checkpoints go: ``[checkpoint] dir`` (a local directory or an
    ``s3://`` prefix), else the run directory's ``checkpoints/``; parts are staged in the run
    directory's ``checkpoints/`` before they are uploaded to a remote one."""
    return Store(job.checkpoint.dir or str(checkpoints_dir(run_dir)), checkpoints_dir(run_dir))


def store_of(at: Store | Path) -> Store:
    """``at`` itself, or the store of a run directory's own ``checkpoints/``."""
    return at if isinstance(at, Store) else Store(str(checkpoints_dir(at)))


def number_name(number: int) -> str:
    return f"{number:06d}"


DENSE_PART = "dense.npz"   # the aggregator's part of a checkpoint


def shard_part(index: int, full: bool) -> str:
    """The name of shard ``index``'s part: its whole table, or the rows changed since."""
    return f"ps-{index}{'' if full else '.delta'}.npz"


def location_of(store: Store, number: int) -> Path | str:
    """Where checkpoint ``number`` is: a local directory, or a URI."""
    return Path(store.root) / number_name(number) if not store.remote \
        else store.location(number_name(number))


# -- manifests -----------------------------------------------------------------------------------
def write_manifest(at: Store | Path, number: int, manifest: dict[str, Any]) -> None:
    """The checkpoint is complete from here on; LATEST names it."""
    store = store_of(at)
    sizes = {}
    for files in manifest["parts"].values():
        for name in files:
            size = store.size(name)
            if size is None:
                raise FileNotFoundError(f"{store.location(name)}, listed in checkpoint "
                                        f"{number}'s manifest, is not there")
            sizes[name] = size
    body = {"format": CHECKPOINT_FORMAT, "number": number, "created": time.time(),
            **manifest, "sizes": sizes}
    store.put_bytes(f"{number_name(number)}/{MANIFEST}",
                    orjson.dumps(body, option=orjson.OPT_INDENT_2))
    store.put_bytes(LATEST, number_name(number).encode())


def read_manifest(where: Path | str) -> dict[str, Any] | None:
    """The manifest of a complete checkpoint (its directory, or URI), else None (none,
    unreadable, or a file it lists missing or of another size)."""
    store = Store(parent(str(where)))
    try:
        manifest = orjson.loads(store.read_bytes(f"{basename(str(where))}/{MANIFEST}"))
    except (OSError, StorageError, orjson.JSONDecodeError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
        return None
    try:
        for name, size in manifest.get("sizes", {}).items():
            if store.size(name) != size:
                return None
    except StorageError:
        return None
    return manifest


def numbers_on_disk(at: Store | Path) -> list[int]:
    """The numbers of the checkpoint directories in the store, complete or not."""
    store = store_of(at)
    if not store.is_dir():
        return []
    return sorted(int(name) for name in store.entries() if name.isdigit())


def latest_complete(at: Store | Path) -> tuple[int, Path | str, dict[str, Any]] | None:
    """(number, directory or URI, manifest) of the newest complete checkpoint, or None."""
    store = store_of(at)
    for number in reversed(numbers_on_disk(store)):
        where = location_of(store, number)
        manifest = read_manifest(where)
        if manifest is not None:
            return number, where, manifest
    return None


def prune(at: Store | Path, keep: int) -> list[int]:
    """Remove the checkpoints older than the newest complete one that neither are among the
    ``keep`` newest complete ones nor hold a file those read (a shard's earlier full or
    incremental file); the numbers removed."""
    store = store_of(at)
    on_disk = numbers_on_disk(store)
    complete = [(n, m) for n in on_disk
                if (m := read_manifest(location_of(store, n))) is not None]
    if not complete:
        return []
    kept = complete[-max(1, keep):]
    newest = kept[-1][0]
    needed = {n for n, _ in kept}
    for _, manifest in kept:
        for files in manifest["parts"].values():
            needed.update(int(name.split("/")[0]) for name in files)
    removed = []
    for n in on_disk:
        if n < newest and n not in needed:
            store.remove(number_name(n))
            removed.append(n)
    return removed
