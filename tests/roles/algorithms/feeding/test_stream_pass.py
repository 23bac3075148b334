"""A stream job's training pass (``roles.algorithms.feeding.stream_pass``): no batch while none
is ready without the pass ending, exhausted only once ended and emptied, each batch's
composition given back once, at its ack."""

from __future__ import annotations

import numpy as np
import pytest

from roles.algorithms.feeding.event_batches import EventBatcher
from roles.algorithms.feeding.stream_pass import StreamPass
from roles.data.stream import Samples
from roles.protocol.datapath import split_batch_id


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
