"""The batches a shard applied (``roles.algorithms.shard.applied``): exact within each part's
newest window of batch numbers, everything older counted applied, in memory that does not
grow with the pass; and as a checkpoint writes and reads it."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from roles.algorithms.shard.applied import AppliedBatches
from roles.protocol.datapath import MAX_SEQ, make_batch_id

WINDOW = 1024


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 3), st.integers(-200, 60)),
                max_size=300))
def test_within_the_window_it_is_the_set_of_ids_applied(steps):
    """Batches of two epochs and four parts applied roughly in order (each a little behind or
    ahead of its part's newest, as workers finish them): any number applied is held, and a
    number not applied is not, down to half a window below its part's newest."""
    applied, model = AppliedBatches(WINDOW), set()
    newest: dict[tuple[int, int], int] = {}
    for epoch, part, step in steps:
        top = newest.get((epoch, part), 0)
        seq = max(0, top + step)
        newest[(epoch, part)] = max(top, seq)
        applied.add(make_batch_id(epoch, part, seq))
        model.add((epoch, part, seq))
    for (epoch, part), top in newest.items():
        for seq in range(max(0, top - WINDOW // 2), top + 50):
            held = make_batch_id(epoch, part, seq) in applied
            assert held == ((epoch, part, seq) in model), (epoch, part, seq, top)
    assert all(make_batch_id(*m) in applied for m in model)   # never forgets one applied


def test_its_memory_stays_within_a_window_a_part_however_long_the_pass():
    applied = AppliedBatches(WINDOW)
    for seq in range(50 * WINDOW):   # a stream's one pass: 50 windows of batches
        applied.add(make_batch_id(0, 3, seq))
    (part,) = applied._parts.values()
    assert len(part.bits) <= WINDOW // 8 and len(applied) <= WINDOW
    assert part.floor > 48 * WINDOW
    top = 50 * WINDOW - 1
    # a copy of a batch in flight (a few behind the newest) is refused; one never applied
    # within the window is taken; one far older than the window counts as applied
    assert make_batch_id(0, 3, top - 10) in applied
    assert make_batch_id(0, 3, top + 1) not in applied
    assert make_batch_id(0, 3, 5) in applied
    assert make_batch_id(0, 4, 5) not in applied   # another part: nothing applied there


def test_a_jump_far_ahead_starts_a_window_there_with_what_lies_below_counted_applied():
    """A restarted stream feeder numbers its batches on from far above its dead process's."""
    applied = AppliedBatches.of([make_batch_id(0, 0, s) for s in (0, 1, 3)], window=WINDOW)
    applied.add(make_batch_id(0, 0, 100 * WINDOW))
    assert make_batch_id(0, 0, 100 * WINDOW) in applied
    assert make_batch_id(0, 0, 100 * WINDOW - 1) not in applied   # within the new window
    assert make_batch_id(0, 0, 2) in applied   # far below: counted applied
    assert len(applied._parts[(0, 0)].bits) <= WINDOW // 8


def test_a_checkpoint_reads_back_what_was_applied_and_the_floors():
    applied = AppliedBatches(WINDOW)
    for seq in [*range(3 * WINDOW), 3 * WINDOW + 5]:
        applied.add(make_batch_id(1, 2, seq))
    applied.add(make_batch_id(1, 7, 4))
    back = AppliedBatches.restored(applied.ids(), applied.floors(), window=WINDOW)
    probes = [make_batch_id(1, p, s) for p in (2, 7, 8) for s in range(0, 3 * WINDOW + 10, 7)]
    probes += [make_batch_id(1, 2, 3 * WINDOW + d) for d in range(10)]
    assert [b in back for b in probes] == [b in applied for b in probes]
    assert len(back) == len(applied) and np.array_equal(back.ids(), applied.ids())
    # a checkpoint written before the floors were kept: its ids, exact
    old = AppliedBatches.restored(np.array([make_batch_id(0, 0, 9)]), None, window=WINDOW)
    assert make_batch_id(0, 0, 9) in old and make_batch_id(0, 0, 8) not in old


def test_a_stream_s_batches_past_2_27_are_held_and_read_back_from_a_checkpoint():
    applied = AppliedBatches(WINDOW)
    seqs = [*range(MAX_SEQ - 5, MAX_SEQ + 5), MAX_SEQ + 9]
    for seq in seqs:
        applied.add(make_batch_id(0, 3, seq))
    back = AppliedBatches.restored(applied.ids(), applied.floors(), window=WINDOW)
    probes = [make_batch_id(0, 3, s) for s in range(MAX_SEQ - 5, MAX_SEQ + 12)]
    assert [b in back for b in probes] == [b in applied for b in probes]
    assert [b in applied for b in probes] == \
        [s in seqs for s in range(MAX_SEQ - 5, MAX_SEQ + 12)]


def test_older_epochs_are_forgotten():
    applied = AppliedBatches.of([make_batch_id(e, 0, 1) for e in range(4)], window=WINDOW)
    applied.forget_epochs_before(2)
    assert [make_batch_id(e, 0, 1) in applied for e in range(4)] == [False, False, True, True]
