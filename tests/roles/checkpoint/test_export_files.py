"""A shard's export file (``embeddings-ps-<i>.npz``), streamed from its table: what ``np.load``
reads is what the whole-array export gave (as (key, row) pairs), memory stays bounded by a
piece, and a failure part way leaves no file."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.algorithms.shard.key_index import KeyIndex
from roles.checkpoint.model_files import (
    load_default_rows,
    load_embeddings,
    npz_bytes,
    save_embeddings,
)
from roles.checkpoint.npz_stream import Entry, whole, write_npz
from zbus.files import atomic_write

DIM = 4


def old_export(path: Path, index: KeyIndex, weights: np.ndarray,
               defaults: np.ndarray | None) -> None:
    """The export as it was: the keys and rows copied whole, sorted by row number, the rows
    gathered whole, the .npz built in memory, then written."""
    keys, rows = index.items()
    order = np.argsort(rows)
    extra = {} if defaults is None else {"defaults": np.asarray(defaults, dtype=np.float32)}
    atomic_write(path, npz_bytes(keys=np.asarray(keys[order], dtype=np.int64),
                                 rows=np.asarray(weights[rows[order]], dtype=np.float32),
                                 **extra))


def table(keys: int, defaults: int = 0, dropped: int = 0, again: int = 0) -> EmbeddingTable:
    """A trained table of ``keys`` keys, ``dropped`` of them dropped (their rows free), then
    ``again`` new keys (reusing free rows)."""
    t = EmbeddingTable(DIM, 0.1, 0.05, seed=3, capacity=16, defaults=defaults)
    rng = np.random.default_rng(7)
    created = rng.choice(1 << 40, keys, replace=False).astype(np.int64) - (1 << 39)
    if keys:
        rows = t.rows_for(created)
        t.adagrad(rows, rng.normal(size=(keys, DIM)).astype(np.float32))
    if defaults:
        t.adagrad(np.arange(defaults), rng.normal(size=(defaults, DIM)).astype(np.float32))
    if dropped:
        t.drop(rng.choice(created, dropped, replace=False))
    if again:
        t.rows_for(np.arange(again, dtype=np.int64) + (1 << 41))
    return t


def pairs(path: Path) -> tuple[set[tuple[int, bytes]], int, np.ndarray | None]:
    keys, rows = load_embeddings(path)
    assert keys.dtype == np.int64 and rows.dtype == np.float32
    assert keys.shape == (len(keys),) and rows.shape == (len(keys), DIM)
    return ({(int(k), r.tobytes()) for k, r in zip(keys, rows, strict=True)}, len(keys),
            load_default_rows(path))


@pytest.mark.parametrize("defaults", [0, 3])
@pytest.mark.parametrize(("keys", "dropped", "again", "chunk"), [
    (0, 0, 0, 64),         # an empty table
    (20, 0, 0, 1 << 20),   # smaller than a piece
    (700, 0, 0, 100),      # several pieces, the last one short (the index has 2048 slots)
    (700, 250, 0, 100),    # free rows (dropped keys)
    (700, 250, 90, 37),    # free rows reused by new keys
])
def test_the_streamed_file_holds_what_the_whole_export_held(tmp_path, defaults, keys, dropped,
                                                            again, chunk):
    t = table(keys, defaults, dropped, again)
    d = t.weights[:defaults] if defaults else None
    old_export(tmp_path / "old.npz", t.index, t.weights, d)
    size = save_embeddings(tmp_path / "new.npz", t.index, t.weights, d, chunk=chunk)
    assert size == (tmp_path / "new.npz").stat().st_size
    old, new = pairs(tmp_path / "old.npz"), pairs(tmp_path / "new.npz")
    assert new[0] == old[0] and new[1] == old[1] == len(t) == len(new[0])   # keys distinct
    if defaults:
        assert new[2] is not None and old[2] is not None
        assert new[2].dtype == np.float32 and np.array_equal(new[2], old[2])
        assert np.abs(new[2]).sum() > 0   # trained
    else:
        assert new[2] is None and old[2] is None
    with np.load(tmp_path / "new.npz") as f:
        assert f.files == ["keys", "rows", *(["defaults"] if defaults else [])]
    assert sorted(os.listdir(tmp_path)) == ["new.npz", "old.npz"]   # no temporary file


def test_the_default_piece_size_writes_the_same_pairs(tmp_path):
    t = table(300, 2, 40)
    old_export(tmp_path / "old.npz", t.index, t.weights, t.weights[:2])
    save_embeddings(tmp_path / "new.npz", t.index, t.weights, t.weights[:2])
    assert pairs(tmp_path / "new.npz")[:2] == pairs(tmp_path / "old.npz")[:2]


def test_a_large_table_is_written_in_bounded_memory(tmp_path, monkeypatch):
    """2M rows x 16 (128 MB of weights), pieces of 64K slots: numpy's allocations (traced by
    tracemalloc) peak at a few MB streamed; the whole-array export peaks over 300 MB."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)   # memory, not the disk, is measured
    n, dim, bound = 2_000_000, 16, 16 << 20
    rng = np.random.default_rng(1)
    index = KeyIndex(1 << 22)   # 2M keys fit without a rebuild
    keys = rng.choice(1 << 50, n, replace=False).astype(np.int64)
    index.insert(keys, rng.permutation(n).astype(np.int64))
    weights = rng.random((n, dim), dtype=np.float32)

    def peak(export) -> int:
        tracemalloc.start()
        try:
            export()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    new = peak(lambda: save_embeddings(tmp_path / "new.npz", index, weights, None,
                                       chunk=1 << 16))
    old = peak(lambda: old_export(tmp_path / "old.npz", index, weights, None))
    assert new < bound < weights.nbytes < old, (new >> 20, old >> 20)
    got_keys, got_rows = load_embeddings(tmp_path / "new.npz")
    assert len(got_keys) == n
    sample = rng.integers(0, n, 1000)
    assert np.array_equal(got_rows[sample], weights[index.find(got_keys[sample])])


@pytest.mark.parametrize("failing_pass", ["keys", "rows"])
def test_a_failure_part_way_leaves_no_file(tmp_path, monkeypatch, failing_pass):
    t = table(700, 3, 100)
    path = tmp_path / "embeddings-ps-0.npz"
    pieces = -(-t.index.capacity // 200)   # per pass
    fail_at = 3 if failing_pass == "keys" else pieces + 3
    walked = []

    def failing(start: int, stop: int):
        walked.append(start)
        if len(walked) == fail_at:
            raise OSError("the disk went away")
        return KeyIndex.live_slots(t.index, start, stop)

    monkeypatch.setattr(t.index, "live_slots", failing)
    with pytest.raises(OSError, match="went away"):
        save_embeddings(path, t.index, t.weights, t.weights[:3], chunk=200)
    assert len(walked) == fail_at and os.listdir(tmp_path) == []   # no file, no temporary

    # a file already there stays as it was
    path.write_bytes(b"the previous export")
    walked.clear()
    with pytest.raises(OSError, match="went away"):
        save_embeddings(path, t.index, t.weights, t.weights[:3], chunk=200)
    assert os.listdir(tmp_path) == [path.name] and path.read_bytes() == b"the previous export"


def test_pieces_that_do_not_add_up_write_nothing(tmp_path):
    """A table that changed under the export (fewer or more rows than ``len(index)`` said)
    fails it rather than writing a file that does not load."""
    path = tmp_path / "x.npz"
    for pieces in ([np.zeros(3, np.int64)], [np.zeros(3, np.int64), np.zeros(3, np.int64)],
                   [np.zeros((5, 2), np.int64)]):
        with pytest.raises(ValueError):
            write_npz(path, [Entry("keys", np.dtype(np.int64), (5,), pieces)])
        assert os.listdir(tmp_path) == []


def test_entries_from_pieces_load_as_the_arrays(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(1000, 3)).astype(np.float32)
    b = rng.integers(-9, 9, 17)
    bounds = [0, 1, 1, 400, 999, 1000]   # an empty piece, one row, a ragged end
    pieces = (a[i:j] for i, j in zip(bounds, bounds[1:], strict=False))
    entries = [Entry("a", a.dtype, a.shape, pieces),
               whole("b", b), whole("empty", np.zeros((0, 3), np.float32)),
               Entry("none", np.dtype(np.float64), (0,), [])]
    write_npz(tmp_path / "x.npz", entries)
    with np.load(tmp_path / "x.npz") as f:
        assert f.files == ["a", "b", "empty", "none"]
        assert np.array_equal(f["a"], a) and f["a"].dtype == np.float32
        assert np.array_equal(f["b"], b) and f["b"].dtype == b.dtype
        assert f["empty"].shape == (0, 3) and f["none"].shape == (0,)
