"""A shard's part of the whole-job checkpoints: a chain of files, written off its loop.

At the cut the shard forks (``roles.checkpoint.background.ForkedWrite``): the child writes
from its copy-on-write image while the parent serves on, so the shard pauses only for the
fork. The child writes either

- ``<number>/ps-<i>.npz``, the whole table: ``keys`` (int64, the key of each row), ``live``
  (bool: the row holds a key; default and free rows do not), ``weights`` and ``accum``
  (float32 [rows, dim], written straight from the table, no copy), ``applied`` and
  ``applied_floors`` (the batch ids whose gradients the rows hold, as the shard keeps them:
  ``roles.algorithms.shard.applied``) and ``meta``; or
- ``<number>/ps-<i>.delta.npz``, what changed since the shard's previous file: the ``keys``,
  ``weights`` and ``accum`` of the live rows marked dirty (a row reused from the free list for
  a new key is dirty), the keys ``dropped`` since (expired, evicted, handed over:
  ``EmbeddingTable.dropped_since_mark``, marked at each fork), ``applied``,
  ``applied_floors`` and ``meta`` (``base``: the previous file).

Both hold ``default_weights`` and ``default_accum``, the default rows (admission's, one per
field; zero rows without admission): a few rows, written whole each time.

A full file is written every ``[checkpoint] full_every`` files, after the rows were renumbered
(a handover), after a write failed, and first. A restore reads the chain in order: the full
file, then each delta (drop, then overwrite), so a key dropped after the full file was written
does not come back from it. The chain's files are what the shard reports in
``CheckpointPart.files``, so that the manifest keeps them all.

A shard that exits while its child writes ends the child (``close``) and removes the file it
left half-written: that checkpoint can no longer be completed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from roles.algorithms.shard.applied import AppliedBatches
from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.checkpoint.background import ForkedWrite, ThreadWrite
from roles.checkpoint.files import meta_array, number_name, read_meta, save_npz, shard_part
from roles.protocol.checkpoint import CheckpointPart
from roles.storage.store import Store
from zbus.files import temp_path


@dataclass
class Restored:
    keys: np.ndarray
    weights: np.ndarray
    accum: np.ndarray
    applied: np.ndarray
    meta: dict
    default_weights: np.ndarray | None = None
    default_accum: np.ndarray | None = None
    applied_floors: np.ndarray | None = None   # (None: a file written before they were kept)


@dataclass
class Writing:
    number: int
    name: str
    path: Path
    chain: list[str]
    kind: str
    writer: ForkedWrite
    started: float
    upload: ThreadWrite | None = None   # a remote store: the file's upload, once written
    size: int = 0


class ShardCheckpoints:
    def __init__(self, index: int, table: EmbeddingTable, full_every: int):
        self.index, self.table, self.full_every = index, table, full_every
        self.chain: list[str] = []  # files a restore reads, relative to checkpoints/
        self.writing: Writing | None = None
        self.force_full = True
        self.written = 0            # the newest checkpoint number this shard wrote

    def own_files(self) -> list[str]:
        """This shard's part files in any checkpoint, as globs relative to the store."""
        return [f"*/{shard_part(self.index, full)}" for full in (True, False)]

    def begin(self, number: int, store: Store | Path, applied: AppliedBatches,
              meta: dict) -> float:
        """Fork the writer of checkpoint ``number`` (into ``store``; a remote one's file is
        written in its local staging directory, and uploaded by this process: the child must
        not use the parent's S3 client); the seconds the fork took (this shard's pause)."""
        t = self.table
        full = self.force_full or t.renumbered or not self.chain \
            or len(self.chain) >= self.full_every
        name = f"{number_name(number)}/{shard_part(self.index, full)}"
        meta = {**meta, "number": number, "kind": "full" if full else "delta",
                "base": None if full else self.chain[-1], "time": time.time(), "keys": len(t)}
        path = as_store(store).local(name)

        def write() -> None:  # in the child: its copy of the table, as it was at the fork
            by_row, live = t.key_of_row()
            done = {"applied": applied.ids(), "applied_floors": applied.floors()}
            d = t.defaults
            defaults = {"default_weights": t.weights[:d], "default_accum": t.accum[:d]}
            if full:
                save_npz(path, keys=by_row, live=live, weights=t.weights[:t.size],
                         accum=t.accum[:t.size], meta=meta_array(meta), **done, **defaults)
                return
            rows = np.flatnonzero(t.dirty[:t.size] & live)
            save_npz(path, keys=by_row[rows], weights=t.weights[rows], accum=t.accum[rows],
                     dropped=t.dropped_since_mark(), meta=meta_array(meta), **done, **defaults)

        started = time.perf_counter()
        writer = ForkedWrite(write)
        t.clear_dirty()
        t.mark()   # the keys dropped from now on go in the next delta
        pause = time.perf_counter() - started
        chain = [name] if full else [*self.chain, name]
        self.writing = Writing(number, name, path, chain, "full" if full else "delta", writer,
                               time.monotonic())
        return pause

    def poll(self, root: Store | Path) -> CheckpointPart | None:
        """The report of the write under way once it is over (None while it goes on): the
        file written, and in a remote store uploaded (on a thread)."""
        store = as_store(root)
        w = self.writing
        if w is None:
            return None
        if w.upload is None:
            result = w.writer.done()
            if result is None:
                return None
            if result[0]:
                w.size = w.path.stat().st_size
            if result[0] and store.remote:
                w.upload = ThreadWrite(lambda: store.publish([w.name]))
                return None
        else:
            result = w.upload.done()
            if result is None:
                return None
        self.writing = None
        ok, error = result
        seconds = time.monotonic() - w.started
        if not ok:
            self.force_full = True  # the rows marked dirty since the last file are unknown
            return CheckpointPart(number=w.number, ok=False, error=error, files=[], bytes=0,
                                  write_s=seconds, info={})
        self.chain, self.force_full, self.written = w.chain, False, w.number
        return CheckpointPart(number=w.number, ok=True, error="", files=list(w.chain),
                              bytes=w.size, write_s=round(seconds, 3),
                              info={"kind": w.kind, "keys": len(self.table),
                                    "chain": len(w.chain)})

    def abandon(self) -> None:
        """The shard's process is gone (killed): a write under way ends as the kernel ends it
        then (``zbus.children``: the writer gets SIGKILL), leaving what it wrote."""
        w = self.writing
        if w is not None and w.upload is None:
            w.writer.stop()

    def close(self) -> int | None:
        """The shard exits: end a write still under way, and remove what it left; the number
        of the checkpoint it was writing (None when none was)."""
        w, self.writing = self.writing, None
        if w is not None and w.upload is not None:
            w.upload.wait()   # an upload under way: finished (its file is whole already)
            return None
        if w is None or w.writer.done() is not None:
            return None
        w.writer.stop()
        temp_path(w.path, w.writer.pid).unlink(missing_ok=True)
        return w.number

    def restored(self, files: list[str]) -> None:
        """The chain a restore read: the next file may build on it."""
        self.chain, self.force_full = list(files), False
        self.table.mark()   # the next delta builds on these files: record what is dropped


def as_store(root: Store | Path) -> Store:
    """A checkpoints directory as a store (a store as it is)."""
    return root if isinstance(root, Store) else Store(str(root))


def read_chain(root: Path | Store, files: list[str]) -> Restored:
    """A shard's rows as its chain of files leaves them (``ValueError`` for a broken chain);
    ``root``: the checkpoints directory, or store, the names are relative to."""
    store = as_store(root)
    keys = np.zeros(0, np.int64)
    weights = accum = np.zeros((0, 0), np.float32)
    applied = np.zeros(0, np.int64)
    floors: np.ndarray | None = None
    meta: dict = {}
    default_weights = default_accum = None
    for i, name in enumerate(files):
        with store.open(name) as file, np.load(file) as f:
            m = read_meta(f)
            if (m["kind"] == "full") != (i == 0) or (i and m["base"] != files[i - 1]):
                raise ValueError(f"{name} does not follow {files[i - 1] if i else 'nothing'} "
                                 "in its shard's chain")
            if m["kind"] == "full":
                live = f["live"]
                keys, weights, accum = f["keys"][live], f["weights"][live], f["accum"][live]
            else:
                new_keys = f["keys"]
                stay = ~np.isin(keys, np.concatenate([f["dropped"], new_keys]))
                keys = np.concatenate([keys[stay], new_keys])
                weights = np.concatenate([weights[stay], f["weights"]])
                accum = np.concatenate([accum[stay], f["accum"]])
            applied, meta = f["applied"], m
            floors = f["applied_floors"] if "applied_floors" in f.files else None
            if "default_weights" in f.files:
                default_weights, default_accum = f["default_weights"], f["default_accum"]
    return Restored(keys, weights, accum, applied, meta, default_weights, default_accum,
                    floors)
