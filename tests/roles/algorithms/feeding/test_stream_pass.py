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
from roles.protocol.datapath import make_batch_id, split_batch_id


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
