"""A stream job's training pass (``roles.algorithms.feeding.stream_pass``): no batch while none
is ready without the pass ending, exhausted only once ended and emptied, each batch's
composition given back once, at its ack."""

from __future__ import annotations

import numpy as np
import pytest

from roles.algorithms.feeding.ack_log import AckLog
from roles.algorithms.feeding.event_batches import EventBatcher
from roles.algorithms.feeding.stream_pass import StreamPass
from roles.data.stream import Samples
from roles.protocol.datapath import MAX_SEQ, make_batch_id, split_batch_id


def events(n: int) -> Samples:
    return Samples(np.zeros((n, 1), np.int64), np.zeros((n, 1), np.float32),
                   np.zeros(n, np.float32), np.ones(n, np.float32))


def test_a_stream_pass_waits_without_ending_and_ends_when_told_and_emptied():
    p = StreamPass(0, 3, EventBatcher(batch_size=4, linger_s=10.0))
    assert p.take() is None and not p.exhausted()
    p.batcher.add(events(6), np.tile([0, 9], (6, 1)), np.zeros(6), now=0.0)
    batch_id, samples = p.take()
    assert split_batch_id(batch_id) == (0, 3, 0) and len(samples) == 4
    assert p.take() is None and not p.exhausted()   # 2 wait for their linger
    p.end()
    batch_id, samples = p.take()
    assert split_batch_id(batch_id) == (0, 3, 1) and len(samples) == 2
    assert p.take() is None and p.exhausted()
    first = p.acked(batch_id)
    assert first is not None and (first.messages, first.counts) == ([(0, 9)], [2])
    assert p.acked(batch_id) is None and p.peek(batch_id) is None
    with pytest.raises(ValueError, match="not handed over"):
        p.add(object())


def test_a_restarted_feeders_stream_pass_numbers_its_batches_above_any_its_dead_process_sent(
        tmp_path):
    """The dead process acked batches 0-4 and 7 and had 8 and 9 in flight (at most 3 at a
    time): 9 + 1 is the least the numbering may go on from; it goes on from 7 + 1 + 3 = 11,
    above every number the dead process can have used. Its holes (5, 6, 8, 9, 10) will never
    be acked: the ack log's progress skips them, so that ``above`` does not grow with every
    later ack."""
    log = AckLog(tmp_path, "feeder-0")
    for seq in (0, 1, 2, 3, 4, 7):
        log.append(make_batch_id(0, 3, seq), 256, 1.0, 256.0, 0)
    logged = log.progress(0)[3]
    assert (logged.low, logged.above) == (5, {7})
    p = StreamPass(0, 3, EventBatcher(batch_size=4, linger_s=10.0))
    assert p.resume(logged, in_flight=3) == 11
    assert StreamPass(0, 3, EventBatcher(4, 10.0)).resume(None, in_flight=3) is None
    p.batcher.add(events(4), np.tile([0, 9], (4, 1)), np.zeros(4), now=0.0)
    batch_id, _ = p.take()
    assert split_batch_id(batch_id) == (0, 3, 11)
    log.skip_below(0, 3, 11)
    log.append(batch_id, 4, 1.0, 4.0, 0)
    after = log.progress(0)[3]
    assert (after.low, after.above) == (12, set()), after   # no hole left behind
    logged.skip_below(11)
    assert (logged.low, logged.above) == (11, set())
    log.close()


def acked(log: AckLog, seqs, worker: int = 0) -> None:
    for seq in seqs:
        log.append(make_batch_id(0, 3, seq), 256, 0.5, 256.0, worker)


def test_a_stream_s_ack_log_compacts_to_its_compact_form_and_reads_back_the_same(tmp_path):
    """A stream's one epoch: compacting takes its records into the totals and empties its
    file; read again, the log is what it was, and acks after it count on."""
    log = AckLog(tmp_path, "feeder-0")
    acked(log, [*range(0, 100), 102, 105], worker=0)
    acked(log, range(106, 120), worker=1)
    before = log.restart()
    log.compact(0)
    assert log._file(0).stat().st_size == 0 and log.restart() == before
    acked(log, [100, 101])
    log.close()
    again = AckLog(tmp_path, "feeder-0")
    done = again.restart()
    assert done["batches"] == before["batches"] + 2 == 118
    assert done["acked_by"] == {"worker-0": 256 * 104, "worker-1": 256 * 14}
    p = again.progress(0)[3]
    assert (p.low, p.above) == (103, {105, *range(106, 120)})
    assert len(again.snapshot()) == 2   # its totals and its one (short) epoch file
    again.close()


@pytest.mark.parametrize("crash", ["after_the_totals", "after_emptying"])
def test_a_compaction_cut_short_by_a_crash_loses_nothing_and_counts_nothing_twice(
        tmp_path, crash, monkeypatch):
    from roles.algorithms.feeding import ack_log
    log = AckLog(tmp_path, "feeder-0")
    acked(log, range(50))
    before = log.restart()
    writes = []
    real = ack_log.atomic_write

    def dies(path, data, durable=True):
        writes.append(path)
        if len(writes) == {"after_the_totals": 2, "after_emptying": 3}[crash]:
            raise SystemExit("killed")
        real(path, data, durable=durable)

    monkeypatch.setattr(ack_log, "atomic_write", dies)
    with pytest.raises(SystemExit):
        log.compact(0)
    monkeypatch.setattr(ack_log, "atomic_write", real)
    log.close()
    again = AckLog(tmp_path, "feeder-0")   # the next process
    assert again.restart() == before
    acked(again, range(50, 60))
    again.close()
    last = AckLog(tmp_path, "feeder-0")
    assert last.restart()["batches"] == 60 and last.progress(0)[3].low == 60
    last.close()


def test_a_stream_pass_numbers_its_batches_on_past_2_27():
    """A stream's pass never ends: past 2^27 batches its ids go on (before, the feeder's
    stream ended in an error there: about 8 days at 50,000 events/s)."""
    p = StreamPass(0, 2, EventBatcher(batch_size=1, linger_s=0.0))
    p.next_seq = MAX_SEQ - 1
    p.batcher.add(events(3), np.tile([0, 9], (3, 1)), np.zeros(3), now=0.0)
    ids = [p.take()[0] for _ in range(3)]
    assert [split_batch_id(b) for b in ids] == [(0, 2, MAX_SEQ - 1 + i) for i in range(3)]
    assert all(p.acked(b) is not None for b in ids)
