"""A shard's log of the batches it applied after each checkpoint snapshot
(roles.algorithms.shard.applied_log): the updates a restarted shard lost are counted exactly,
whichever complete checkpoint it goes back to."""

from roles.algorithms.shard.applied_log import AppliedLog


def test_the_updates_applied_after_the_restored_checkpoint_are_counted_exactly(tmp_path):
    log = AppliedLog(tmp_path / "ps-0")
    log.restart(0)
    for batch in (1, 2, 3):
        log.append(batch)
    log.start(1)                             # checkpoint 1's snapshot holds 1, 2, 3
    for batch in (4, 5):
        log.append(batch)
    log.close()                              # the process dies here
    again = AppliedLog(tmp_path / "ps-0")
    assert again.lost(1, {1, 2, 3}) == [4, 5]
    again.restart(1)                         # the restarted shard is checkpoint 1 now
    assert again.lost(1, {1, 2, 3}) == []
    again.append(6)                          # ... and dies again before the next snapshot
    assert AppliedLog(tmp_path / "ps-0").lost(1, {1, 2, 3}) == [6]


def test_a_checkpoint_that_never_completed_is_not_the_one_restored(tmp_path):
    """Snapshot 2 was taken but its checkpoint never completed: the restart goes back to 1,
    and what was applied after either snapshot is lost."""
    log = AppliedLog(tmp_path / "ps-1")
    log.restart(0)
    log.append(1)
    log.start(1)
    log.append(2)
    log.start(2)
    log.append(3)
    assert log.lost(1, {1}) == [2, 3]
    assert log.lost(0, set()) == [1, 2, 3]   # no checkpoint complete: everything is lost


def test_segments_before_the_newest_complete_checkpoint_are_pruned(tmp_path):
    log = AppliedLog(tmp_path / "ps-2")
    log.restart(0)
    for number in (1, 2, 3):
        log.append(number)
        log.start(number)
        log.prune(number - 1)                # checkpoint number - 1 is the newest complete
    assert sorted(log.segments()) == [2, 3]
    assert log.lost(2, {1, 2}) == [3]


def test_a_record_torn_by_the_crash_is_left_out(tmp_path):
    log = AppliedLog(tmp_path / "ps-3")
    log.restart(0)
    log.append(11)
    log.append(-12)
    log.close()
    with open(log.segments()[0], "ab") as f:
        f.write(b"\x01\x02\x03")             # 3 of a record's 8 bytes
    assert AppliedLog(tmp_path / "ps-3").lost(0, set()) == [11, -12]
