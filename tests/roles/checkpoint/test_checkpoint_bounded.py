"""A shard's chain of checkpoint files with bounded tables, without sockets: keys expired or
evicted since the previous file are recorded as dropped and stay dropped on restore, a row
reused from the free list is written as changed, the default rows go in every file."""

from __future__ import annotations

import numpy as np

from roles.algorithms.shard.applied import AppliedBatches
from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.algorithms.shard.expiry import Expiry
from roles.checkpoint.files import checkpoints_dir
from roles.checkpoint.shard import ShardCheckpoints, read_chain

META = {"updates": 0, "newest_epoch": 0, "version": 0}


def seen(t: EmbeddingTable, keys) -> np.ndarray:
    t.clock += 1
    return t.rows_for(np.asarray(keys, dtype=np.int64))


def write(shard: ShardCheckpoints, root, number: int):
    shard.begin(number, root, AppliedBatches(), META)
    shard.writing.writer.wait()
    part = shard.poll(root)
    assert part is not None and part.ok
    return part


def as_dict(keys, weights):
    return {int(k): w.tolist() for k, w in zip(keys, weights, strict=True)}


def live_dict(t: EmbeddingTable, array: np.ndarray):
    keys, rows = t.live()
    return as_dict(keys, array[rows])


def expire(t: EmbeddingTable, exp: Expiry) -> None:
    for _ in range(20):
        exp.tick(t, 0.0, list)


def test_dropped_keys_go_in_the_next_delta_and_do_not_come_back_from_the_full_file(tmp_path):
    root = checkpoints_dir(tmp_path)
    t = EmbeddingTable(4, 0.1, 0.05, seed=3, defaults=2)
    exp = Expiry(expire_batches=5, expire_s=0, max_rows=0, now=0.0)
    shard = ShardCheckpoints(0, t, full_every=8)
    seen(t, range(10, 20))
    t.adagrad(np.array([0, 1]), np.ones((2, 4), np.float32))   # the default rows trained
    full = write(shard, root, 1)
    assert full.info["kind"] == "full"
    # keys 10..14 stay, 15..19 expire; their rows are reused by new keys 30..32
    for _ in range(6):
        seen(t, range(10, 15))
    expire(t, exp)
    assert exp.expired == 5 and t.free_rows == 5
    reused = seen(t, [30, 31, 32])
    assert t.free_rows == 2 and reused.max() < t.size
    t.adagrad(np.array([1]), np.full((1, 4), 2.0, np.float32))
    delta = write(shard, root, 2)
    assert delta.info["kind"] == "delta"
    with np.load(root / delta.files[1]) as f:
        assert sorted(f["dropped"].tolist()) == [15, 16, 17, 18, 19]
        assert sorted(f["keys"].tolist()) == [30, 31, 32]     # reused rows written as changed
        assert np.array_equal(f["default_weights"], t.weights[:2])
    got = read_chain(root, delta.files)
    assert as_dict(got.keys, got.weights) == live_dict(t, t.weights)
    assert as_dict(got.keys, got.accum) == live_dict(t, t.accum)
    assert np.array_equal(got.default_weights, t.weights[:2])
    assert np.array_equal(got.default_accum, t.accum[:2])
    # a key dropped and back again since the last file: dropped, then its new row
    for _ in range(6):
        seen(t, [10, 30, 31, 32])
    expire(t, exp)
    seen(t, [11, 40])
    third = write(shard, root, 3)
    with np.load(root / third.files[2]) as f:
        assert 11 in f["dropped"].tolist() and 11 in f["keys"].tolist()
    got = read_chain(root, third.files)
    assert as_dict(got.keys, got.weights) == live_dict(t, t.weights)
    # restored into a fresh table: what was live, nothing expired comes back
    back = EmbeddingTable(4, 0.1, 0.05, seed=3, defaults=2)
    back.accept(got.keys, got.weights, got.accum)
    back.restore_defaults(got.default_weights, got.default_accum)
    assert live_dict(back, back.weights) == live_dict(t, t.weights)
    assert np.array_equal(back.weights[:2], t.weights[:2])


def test_a_restored_shard_records_its_drops_for_the_delta_on_its_chain(tmp_path):
    root = checkpoints_dir(tmp_path)
    t = EmbeddingTable(4, 0.1, 0.05, seed=3)
    shard = ShardCheckpoints(0, t, full_every=8)
    seen(t, range(8))
    full = write(shard, root, 1)
    got = read_chain(root, full.files)
    back = EmbeddingTable(4, 0.1, 0.05, seed=3)
    back.accept(got.keys, got.weights, got.accum)
    back.clear_dirty()
    restored = ShardCheckpoints(0, back, full_every=8)
    restored.restored(full.files)
    assert back.drop(np.array([2, 3])) == 2
    delta = write(restored, root, 2)
    assert delta.info["kind"] == "delta"
    assert sorted(read_chain(root, delta.files).keys.tolist()) == [0, 1, 4, 5, 6, 7]


def test_evicted_keys_are_dropped_in_the_chain_too(tmp_path):
    root = checkpoints_dir(tmp_path)
    t = EmbeddingTable(4, 0.1, 0.05, seed=3)
    exp = Expiry(expire_batches=0, expire_s=0, max_rows=64, now=0.0)
    shard = ShardCheckpoints(0, t, full_every=8)
    seen(t, range(60))
    write(shard, root, 1)
    for k in range(60, 100, 4):
        seen(t, range(k, k + 4))
        expire(t, exp)
    assert exp.evicted > 0 and len(t) <= 64
    delta = write(shard, root, 2)
    got = read_chain(root, delta.files)
    assert sorted(got.keys.tolist()) == sorted(t.live()[0].tolist())
