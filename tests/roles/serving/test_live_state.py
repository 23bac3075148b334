"""The pure parts of live serving, without sockets: a shard table's change log
(``EmbeddingTable.changes``), the overlay of rows changed since a checkpoint (tombstones), and
one join's state (``LiveState``): a cut served only once every part is in, a lost part or a
restarted shard a resync, weights not seen asked for again."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.protocol.dense_sync import Weights
from roles.protocol.serving import DenseDelta, RowDelta, RowsCaughtUp, row_values
from roles.serving.live import LiveState, Resync
from roles.serving.overlay import Overlay
from roles.serving.publishing import DensePublisher, RowPublisher
from zbus.codec import ProtocolError, decode

DIM = 4


def test_the_change_log_gives_the_rows_changed_and_the_keys_dropped_since_the_last_cut():
    t = EmbeddingTable(DIM, 0.1, 0.5, capacity=8)
    t.create(np.array([1, 2, 3], np.int64))   # before follow(): not recorded
    pub = RowPublisher(0, t)
    first = pub.cut(10)
    assert first.previous == 0 and len(first.keys) == 0 and len(first.dropped) == 0
    rows = t.lookup(np.array([2, 3], np.int64))
    t.adagrad(rows, np.ones((2, DIM), np.float32))
    t.drop(np.array([3], np.int64))
    t.create(np.array([3, 4], np.int64))      # 3 dropped and made again: in both
    t.drop(np.array([1], np.int64))
    d = pub.cut(20)
    assert d.previous == 10 and d.cut == 20
    assert sorted(d.keys.tolist()) == [2, 3, 4] and sorted(d.dropped.tolist()) == [1, 3]
    for k, row in zip(d.keys.tolist(), d.rows, strict=True):
        np.testing.assert_array_equal(row, t.weights[t.index.find(np.array([k]))[0]])
    empty = pub.cut(30)
    assert len(empty.keys) == 0 and len(empty.dropped) == 0   # nothing since
    assert pub.cut(30) is None and pub.cut(25) is None         # repeated or old cuts


def table_now(t: EmbeddingTable) -> dict[int, np.ndarray]:
    keys, rows = t.live()
    return {int(k): t.weights[r].copy() for k, r in zip(keys, rows, strict=True)}


@pytest.mark.parametrize("seed", range(5))
def test_the_deltas_applied_in_order_rebuild_the_table_whatever_it_went_through(seed):
    """Random creates, updates (a row in several batches between two cuts), drops and
    re-creations, handovers in and out: the table as a follower rebuilds it from the deltas
    (drops first) is the table, at every cut."""
    rng = np.random.default_rng(seed)
    t = EmbeddingTable(DIM, 0.1, 0.5, capacity=4)
    pub = RowPublisher(0, t)
    served: dict[int, np.ndarray] = {}
    for cut in range(1, 40):
        for _ in range(rng.integers(1, 5)):
            op = rng.integers(0, 5)
            keys = np.unique(rng.integers(0, 60, rng.integers(1, 12))).astype(np.int64)
            rows = t.lookup(keys)
            if op == 0:
                t.create(keys[rows < 0])
            elif op == 1 and (rows >= 0).any():
                here = rows[rows >= 0]
                t.adagrad(here, rng.normal(size=(len(here), DIM)).astype(np.float32))
            elif op == 2:
                t.drop(keys)
            elif op == 3:
                t.accept(keys, rng.normal(size=(len(keys), DIM)).astype(np.float32),
                         np.ones((len(keys), DIM), np.float32))
            elif op == 4 and len(t):
                leaving = np.zeros(t.size, bool)
                live_rows = t.live()[1]
                leaving[live_rows[rng.random(len(live_rows)) < 0.3]] = True
                t.release(leaving)
        d = pub.cut(cut)
        for k in d.dropped.tolist():
            served.pop(k, None)
        for k, row in zip(d.keys.tolist(), d.rows, strict=True):
            served[k] = row
        now = table_now(t)
        assert served.keys() == now.keys()
        for k, row in now.items():
            np.testing.assert_array_equal(served[k], row)


def test_a_restored_table_publishes_the_changes_after_the_restore_only():
    """A restarted shard's first cut is not its whole table (servers join it on the
    checkpoint it restored)."""
    t = EmbeddingTable(DIM, 0.1, 0.5, capacity=8)
    pub = RowPublisher(0, t)
    t.accept(np.arange(100, dtype=np.int64), np.ones((100, DIM), np.float32),
             np.ones((100, DIM), np.float32))   # the checkpoint's rows
    t.drop(np.array([5], np.int64))
    t.forget_changes()
    t.create(np.array([500], np.int64))
    d = pub.cut(1)
    assert d.keys.tolist() == [500] and len(d.dropped) == 0


def test_a_handover_renumbering_the_rows_keeps_the_changes_by_key():
    t = EmbeddingTable(DIM, 0.1, 0.5, capacity=8)
    pub = RowPublisher(0, t)
    t.create(np.array([5, 6, 7, 8], np.int64))
    leaving = np.zeros(t.size, bool)
    leaving[t.index.find(np.array([5, 7], np.int64))] = True
    t.release(leaving)
    d = pub.cut(1)
    assert sorted(d.keys.tolist()) == [6, 8] and sorted(d.dropped.tolist()) == [5, 7]
    np.testing.assert_array_equal(d.rows[np.argsort(d.keys)],
                                  t.weights[t.index.find(np.array([6, 8], np.int64))])


def test_a_late_joiner_is_answered_with_what_changed_since_the_snapshot_it_loaded():
    t = EmbeddingTable(DIM, 0.1, 0.5, capacity=8)
    pub = RowPublisher(2, t)
    t.create(np.array([1, 2], np.int64))
    t.clear_dirty()
    t.mark()                                   # checkpoint 7's snapshot
    t.create(np.array([3], np.int64))
    t.drop(np.array([1], np.int64))
    pub.cut(40)
    answer = pub.caught_up(7, 7)
    assert answer.cut == 40 and answer.checkpoint == 7 and answer.shard == 2
    assert answer.keys.tolist() == [3] and answer.dropped.tolist() == [1]
    other = pub.caught_up(6, 7)                # not the snapshot it has: only which it is
    assert other.checkpoint == 7 and len(other.keys) == 0


def test_the_overlay_applies_drops_first_and_serves_tombstones_as_keys_without_rows():
    o = Overlay.empty(2)
    o = o.merged(np.array([5, 1], np.int64), np.array([[5, 5], [1, 1]], np.float32),
                 np.zeros(0, np.int64))
    o = o.merged(np.array([9], np.int64), np.array([[9, 9]], np.float32),
                 np.array([5, 3, 9], np.int64))   # 9 dropped and made again: its row stands
    assert o.keys.tolist() == [1, 3, 5, 9] and o.live.tolist() == [True, False, False, True]
    found, rows, live = o.find(np.array([9, 3, 2, 1], np.int64))
    assert found.tolist() == [True, True, False, True]
    assert live.tolist() == [True, False, False, True]
    np.testing.assert_array_equal(rows, [[9, 9], [0, 0], [0, 0], [1, 1]])
    before = o.rows.copy()
    o.merged(np.array([1], np.int64), np.array([[7, 7]], np.float32), np.zeros(0, np.int64))
    np.testing.assert_array_equal(o.rows, before)   # immutable: a version never changes


class Base:
    """The little of a checkpoint's model a LiveState reads before serving."""

    def __init__(self):
        from roles.job.settings import load_job
        self.job = load_job(None, environ={})   # the built-in synthetic job
        self.layout = self.job.layout()
        self.keys = np.zeros(0, np.int64)
        self.manifest = {"number": 3, "round": 1}


def float_rows(dim: int) -> dict[str, np.ndarray]:
    """No int8 rows: the rows travel as float32."""
    return {"qrows": np.zeros((0, dim), np.int8), "scales": np.zeros(0, np.float32)}


def delta(shard: int, cut: int, previous: int, keys=(), incarnation="a") -> RowDelta:
    k = np.array(keys, np.int64)
    dim = Base().layout.row_dim
    return RowDelta(shard=shard, cut=cut, previous=previous, incarnation=incarnation, keys=k,
                    rows=np.ones((len(k), dim), np.float32), dropped=np.zeros(0, np.int64),
                    defaults=np.zeros((0, dim), np.float32), **float_rows(dim))


def joined_state(monkeypatch) -> LiveState:
    s = LiveState(Base(), 3, 2)   # type: ignore[arg-type]
    monkeypatch.setattr(LiveState, "served", lambda self, n: f"served {n}")
    dim = Base().layout.row_dim
    s.add_rows(delta(0, 100, 90))                    # before the answer: in the catch-up
    for shard in (0, 1):
        assert s.caught_up(RowsCaughtUp(shard=shard, checkpoint=3, cut=100, incarnation="a",
                                        keys=np.zeros(0, np.int64),
                                        rows=np.zeros((0, dim), np.float32),
                                        dropped=np.zeros(0, np.int64),
                                        defaults=np.zeros((0, dim), np.float32),
                                        **float_rows(dim)))
    assert not s.joined and s.advance() is None     # no weights yet
    s.weights(Weights(round=4, step=0, generation=0, params=np.zeros(3, np.float32)))
    assert s.joined
    return s


def test_a_cut_is_served_once_every_shard_and_the_aggregator_sent_their_parts(monkeypatch):
    s = joined_state(monkeypatch)
    dense = DensePublisher()
    s.add_rows(delta(0, 110, 100, [1]))
    s.add_dense(dense.cut(110, 4, 0, 0, np.zeros(3, np.float32)))
    assert s.advance() is None                       # ps-1's part of 110 is not in
    s.add_rows(delta(1, 110, 100, [2]))
    assert s.advance() == "served 110" and s.overlay.keys.tolist() == [1, 2]
    s.add_rows(delta(0, 120, 110))                   # ps-1 missed cut 120: 130 follows 110
    s.add_dense(dense.cut(120, 4, 0, 0, np.zeros(3, np.float32)))
    s.add_rows(delta(0, 130, 120, [3]))
    s.add_rows(delta(1, 130, 110, [4]))
    s.add_dense(dense.cut(130, 5, 0, 0, np.ones(3, np.float32)))
    assert s.advance() == "served 130" and s.round == 5
    assert s.overlay.keys.tolist() == [1, 2, 3, 4]


def test_a_key_that_moved_between_shards_in_a_cut_stays_served(monkeypatch):
    """ps-1 hands key 7 to ps-0 at cut 110: ps-0's part has its row, ps-1's drops it. Taken
    shard by shard, ps-1's drop came after ps-0's row and made the key a tombstone."""
    s = joined_state(monkeypatch)
    dim = Base().layout.row_dim
    s.add_rows(delta(0, 110, 100, [7]))
    moved_out = delta(1, 110, 100)
    s.add_rows(RowDelta(shard=1, cut=110, previous=100, incarnation="a", keys=moved_out.keys,
                        rows=moved_out.rows, dropped=np.array([7], np.int64),
                        defaults=np.zeros((0, dim), np.float32), **float_rows(dim)))
    s.add_dense(DensePublisher().cut(110, 4, 0, 0, np.zeros(3, np.float32)))
    assert s.advance() == "served 110"
    found, _, live = s.overlay.find(np.array([7], np.int64))
    assert found.tolist() == [True] and live.tolist() == [True]


def test_a_lost_part_or_a_restarted_shard_ends_the_join(monkeypatch):
    s = joined_state(monkeypatch)
    s.add_rows(delta(0, 120, 110))                   # 110 never came
    s.add_rows(delta(1, 120, 100))
    s.add_dense(DensePublisher().cut(120, 4, 0, 0, np.zeros(3, np.float32)))
    with pytest.raises(Resync, match="a part was lost"):
        s.advance()
    s = joined_state(monkeypatch)
    with pytest.raises(Resync, match="started again"):
        s.add_rows(delta(1, 110, 0, incarnation="b"))
    s = joined_state(monkeypatch)   # the aggregator is down: its parts never come
    monkeypatch.setattr("roles.serving.live.MAX_WAITING_CUTS", 3)
    with pytest.raises(Resync, match="wait for the others"):
        for cut in range(110, 150, 10):
            s.add_rows(delta(0, cut, cut - 10))
            s.add_rows(delta(1, cut, cut - 10))
            s.advance()


def test_weights_not_seen_are_asked_for_and_the_cut_waits_for_them(monkeypatch):
    s = joined_state(monkeypatch)
    s.add_rows(delta(0, 110, 100))
    s.add_rows(delta(1, 110, 100))
    s.add_dense(DenseDelta(cut=110, previous=105, round=6, step=0, generation=0,
                           params=np.zeros(0, np.float32)))   # round 6's weights were lost
    assert s.advance() is None and s.wants_weights
    s.weights(Weights(round=6, step=0, generation=0, params=np.ones(3, np.float32)))
    s.add_rows(delta(0, 120, 110))
    s.add_rows(delta(1, 120, 110))
    s.add_dense(DenseDelta(cut=120, previous=110, round=6, step=0, generation=0,
                           params=np.zeros(0, np.float32)))
    assert s.advance() == "served 120" and s.round == 6


def test_an_answer_for_another_checkpoint_is_refused():
    s = LiveState(Base(), 3, 1)   # type: ignore[arg-type]
    dim = Base().layout.row_dim
    assert not s.caught_up(RowsCaughtUp(shard=0, checkpoint=4, cut=0, incarnation="a",
                                        keys=np.zeros(0, np.int64),
                                        rows=np.zeros((0, dim), np.float32),
                                        dropped=np.zeros(0, np.int64),
                                        defaults=np.zeros((0, dim), np.float32),
                                        **float_rows(dim)))


def test_int8_rows_come_back_within_half_a_scale_and_travel_in_a_third_of_the_bytes():
    """``[serving] row_bytes = 1``: each row as int8 with its scale (largest magnitude over
    127); scaled back, every value within half a scale of the trained one, a row of zeros
    exactly; a width-16 row is 20 bytes in place of 64. On the wire both kinds decode; a
    message with both kinds of rows or a negative scale is refused, a NaN scale too."""
    published = {}
    for row_bytes in (4, 1):
        t = EmbeddingTable(16, 0.1, 0.5, seed=2, capacity=64)
        publisher = RowPublisher(0, t, row_bytes=row_bytes)
        rows = t.rows_for(np.arange(40, dtype=np.int64))
        t.adagrad(rows[:30], np.random.default_rng(4).normal(0, 1, (30, 16)).astype(np.float32))
        t.weights[rows[35]] = 0.0
        d = publisher.cut(5)
        assert d is not None and len(d.keys) == 40
        published[row_bytes] = (d, t.weights[t.index.find(d.keys)], publisher)
    (f, want, exact), (q, _, int8) = published[4], published[1]
    assert np.array_equal(row_values(f), want) and exact.row_bytes_published == 40 * 64
    assert len(q.rows) == 0 and q.qrows.shape == (40, 16) and int8.row_bytes_published == 40 * 20
    got = row_values(q)
    assert (np.abs(got - want) <= q.scales[:, None] / 2 + 1e-7).all()
    assert not np.array_equal(got, want)   # (quantized: not the same values)
    assert np.array_equal(got[q.keys == 35], np.zeros((1, 16), np.float32))
    for m in (f, q):
        assert np.array_equal(row_values(decode(m.to_frames("ps-0", 1)).msg), row_values(m))
    for bad in (dataclasses.replace(q, rows=np.ones((40, 16), np.float32)),
                dataclasses.replace(q, scales=-q.scales - 1)):
        with pytest.raises(ProtocolError):
            decode(bad.to_frames("ps-0", 2))
    nan = dataclasses.replace(q, scales=np.full(40, np.nan, np.float32))
    with pytest.raises(ProtocolError):
        decode(nan.to_frames("ps-0", 3)).msg.require_finite()
