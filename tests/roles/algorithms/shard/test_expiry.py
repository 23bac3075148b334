"""Expiry and eviction of a shard's rows: freed rows reused, held rows never dropped, default
rows kept, what a checkpoint needs (live rows, keys dropped since a mark)."""

from __future__ import annotations

import numpy as np

from roles.algorithms.shard.embedding_table import EmbeddingTable, initial_rows
from roles.algorithms.shard.expiry import EVICT_MARGIN, MAX_DROPS, MAX_PIECE, MIN_PIECE, Expiry


def seen(t: EmbeddingTable, keys) -> np.ndarray:
    """One batch of distinct keys looked up (the clock advances as a shard's does)."""
    t.clock += 1
    return t.rows_for(np.asarray(keys, dtype=np.int64))


def nothing_held() -> list[np.ndarray]:
    return []


def run(exp: Expiry, t: EmbeddingTable, now: float = 0.0, held=nothing_held,
        ticks: int = 20) -> None:
    for _ in range(ticks):
        exp.tick(t, now, held)


def test_rows_not_seen_for_expire_batches_are_dropped_and_their_rows_reused():
    t = EmbeddingTable(4, 0.1, 0.5, seed=2, defaults=3)
    exp = Expiry(expire_batches=10, expire_s=0, max_rows=0, now=0.0)
    old = seen(t, [1, 2, 3])
    for _ in range(10):
        seen(t, [1, 100])
    run(exp, t)
    assert exp.expired == 2 and exp.sweeps >= 1
    assert sorted(t.live()[0].tolist()) == [1, 100]
    assert t.free_rows == 2 and (t.index.find(np.array([2, 3])) == -1).all()
    size = t.size
    again = seen(t, [2, 7])      # new keys take the freed rows, from their initial values
    assert t.size == size and set(again.tolist()) == set(old[1:].tolist())
    assert np.array_equal(t.weights[again], initial_rows(np.array([2, 7]), 4, 0.1, 2))
    assert (t.accum[again] == 0).all()
    assert np.allclose(t.weights[:3], 0)     # the default rows never expire


def test_a_held_batchs_rows_are_never_dropped():
    t = EmbeddingTable(4, 0.1, 0.5)
    exp = Expiry(expire_batches=4, expire_s=0, max_rows=0, now=0.0)
    held = seen(t, [5, 6])
    for _ in range(20):
        seen(t, [7])
    run(exp, t, held=lambda: [held])
    assert sorted(t.live()[0].tolist()) == [5, 6, 7]
    run(exp, t)
    for _ in range(20):       # released, and unseen for long enough: gone
        seen(t, [7])
        run(exp, t, ticks=1)
    assert sorted(t.live()[0].tolist()) == [7]


def test_expire_s_goes_by_time_also_on_an_idle_shard():
    t = EmbeddingTable(4, 0.1, 0.5)
    exp = Expiry(expire_batches=0, expire_s=64.0, max_rows=0, now=0.0)
    seen(t, [1, 2])
    for now in range(0, 60, 2):
        exp.tick(t, float(now), nothing_held)
        if now == 30:
            seen(t, [2])
    assert len(t) == 2        # key 1 last seen at 0 s: not yet 64 s
    for now in range(60, 90, 2):
        exp.tick(t, float(now), nothing_held)
    assert t.live()[0].tolist() == [2]
    for now in range(90, 140, 2):   # no batch since 30 s: key 2 goes too
        exp.tick(t, float(now), nothing_held)
    assert len(t) == 0 and exp.expired == 2
    assert len(exp.marks) <= 34     # the time marks the horizon needs, no more


def test_a_sweep_is_done_in_bounded_pieces():
    t = EmbeddingTable(2, 0.1, 0.5)
    keys = np.arange(1, 300_001, dtype=np.int64)
    seen(t, keys)
    exp = Expiry(expire_batches=8, expire_s=0, max_rows=0, now=0.0)
    for _ in range(8):
        seen(t, [])
    exp.tick(t, 0.0, nothing_held)
    # one piece per tick: MIN_PIECE rows walked, at most MAX_DROPS of them dropped
    assert exp.expired == min(MIN_PIECE, MAX_DROPS) and exp.cursor == exp.expired
    run(exp, t, ticks=300_000 // MAX_DROPS)
    assert exp.expired == len(keys) and len(t) == 0 and t.free_rows == len(keys)
    assert MAX_PIECE * 16 >= 10_000_000     # a 10M-row table: pieces of 625k rows


def test_beyond_the_cap_the_least_recently_seen_are_evicted_below_it():
    t = EmbeddingTable(4, 0.1, 0.5, defaults=2)
    cap = 160
    exp = Expiry(expire_batches=0, expire_s=0, max_rows=cap, now=0.0)
    for b in range(20):
        seen(t, np.arange(b * 10, b * 10 + 10))
        seen(t, [0, 1])        # two keys seen all the time
        exp.tick(t, 0.0, nothing_held)
    assert len(t) <= cap and exp.evicted == 200 - len(t) > 0
    assert len(t) >= cap - cap * EVICT_MARGIN - 10
    live = set(t.live()[0].tolist())
    assert {0, 1, 199} <= live and not {10, 11} & live  # the oldest went first
    batch_of = {k: k // 10 for k in range(2, 200)}   # evicted by batch: oldest first
    kept = [batch_of[k] for k in live - {0, 1}]
    gone = [batch_of[k] for k in set(batch_of) - live]
    assert min(kept) >= max(gone)
    assert t.size <= cap + 10 + 2    # freed rows were reused: the arrays did not grow


def test_eviction_spares_held_rows():
    t = EmbeddingTable(4, 0.1, 0.5)
    exp = Expiry(expire_batches=0, expire_s=0, max_rows=16, now=0.0)
    held = seen(t, np.arange(100, 110))
    for b in range(5):
        seen(t, np.arange(b * 4, b * 4 + 4))
    exp.tick(t, 0.0, lambda: [held])
    assert set(range(100, 110)) <= set(t.live()[0].tolist())
    assert len(t) <= 16


def test_dropped_keys_are_recorded_from_a_mark_for_incremental_checkpoints():
    t = EmbeddingTable(4, 0.1, 0.5)
    exp = Expiry(expire_batches=2, expire_s=0, max_rows=0, now=0.0)
    seen(t, [1, 2, 3])
    t.drop(np.array([3]))
    assert t.dropped_since_mark().size == 0   # not recording before the first mark
    t.mark()
    seen(t, [9])
    seen(t, [9])
    seen(t, [9])
    run(exp, t)
    assert t.dropped_since_mark().tolist() == [1, 2]
    leaving = np.zeros(t.size, dtype=bool)
    leaving[t.index.find(np.array([9]))] = True
    t.release(leaving)
    assert t.dropped_since_mark().tolist() == [1, 2, 9]
    t.mark()
    assert t.dropped_since_mark().size == 0


def test_release_and_accept_keep_working_with_free_and_default_rows():
    a = EmbeddingTable(4, 0.1, 0.5, seed=3, defaults=2)
    b = EmbeddingTable(4, 0.1, 0.5, seed=3, defaults=2)
    keys = np.arange(1, 41, dtype=np.int64)
    rows = seen(a, keys)
    a.adagrad(rows, np.ones((40, 4), np.float32))
    a.adagrad(np.array([0, 1]), np.full((2, 4), 2.0, np.float32))
    defaults = a.default_state()
    a.drop(keys[:10])                      # ten free rows in the middle
    state = {int(k): (a.weights[r].copy(), a.accum[r].copy())
             for k, r in zip(*a.live(), strict=True)}
    leaving = np.zeros(a.size, dtype=bool)
    leaving[a.index.find(keys[10:20])] = True
    moved, weights, accum = a.release(leaving)
    assert sorted(moved.tolist()) == keys[10:20].tolist()
    assert a.size == 2 + 20 and a.free_rows == 0 and len(a) == 20
    assert np.array_equal(a.default_state()[0], defaults[0])
    for k, r in zip(*a.live(), strict=True):
        assert r >= 2 and np.array_equal(a.weights[r], state[int(k)][0])
    b.accept(moved, weights, accum)
    b.restore_defaults(*defaults)
    for k, r in zip(*b.live(), strict=True):
        assert r >= 2 and np.array_equal(b.accum[r], state[int(k)][1])
    assert np.array_equal(b.weights[:2], defaults[0])
