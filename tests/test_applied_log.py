"""A shard's log of the batches it applied since its checkpoint (roles.algorithms.applied_log):
the updates a restarted shard lost are counted exactly, whenever the process died."""

from roles.algorithms.applied_log import AppliedLog


def test_the_updates_applied_after_the_checkpoint_are_counted_exactly(tmp_path):
    path = tmp_path / "ps-0.applied"
    log = AppliedLog(path)
    for batch in (1, 2, 3):
        log.append(batch)
    log.checkpointed()                       # the checkpoint holds 1, 2, 3
    for batch in (4, 5):
        log.append(batch)
    log.close()                              # the process dies here
    again = AppliedLog(path)
    assert again.lost({1, 2, 3}) == [4, 5]
    again.checkpointed()                     # the restarted shard is its checkpoint now
    assert again.lost({1, 2, 3}) == []


def test_a_checkpoint_written_but_not_yet_noted_in_the_log_counts_nothing_twice(tmp_path):
    log = AppliedLog(tmp_path / "ps-1.applied")
    for batch in (7, 8, 9):
        log.append(batch)
    # the process died after writing the checkpoint (it holds 7 and 8), before emptying the log
    assert log.lost({7, 8}) == [9]


def test_a_record_torn_by_the_crash_is_left_out(tmp_path):
    path = tmp_path / "ps-2.applied"
    log = AppliedLog(path)
    log.append(11)
    log.append(-12)
    log.close()
    with open(path, "ab") as f:
        f.write(b"\x01\x02\x03")             # 3 of a record's 8 bytes
    assert AppliedLog(path).lost(set()) == [11, -12]
