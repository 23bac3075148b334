"""A feeder's ack log in the checkpoint store (``roles.checkpoint.stored_acks``), for a feeder
whose pod is made again with an empty disk: the log's compact form (what it holds, in a size
that does not grow with the batches), a log started from it, the copy written off the loop at
most once per interval, and the bound that keeps every ack missing from the copy among those
the workers keep (pure; the store a local directory)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from roles.algorithms.feeding.ack_log import AckLog, read_position, seed
from roles.algorithms.feeding.tally import FeederTally
from roles.algorithms.sync.feeder import for_mode
from roles.checkpoint.stored_acks import StoredAcks
from roles.feeder.ledger_side import LedgerSide
from roles.job.settings import parse_job
from roles.protocol.datapath import make_batch_id
from roles.storage.store import Store


def acked(log: AckLog, epoch: int, part: int, seqs, samples: int = 10, worker: int = 0):
    for seq in seqs:
        log.append(make_batch_id(epoch, part, seq), samples, 1.5, float(samples), worker)


def test_a_log_started_from_the_compact_form_holds_what_the_log_held(tmp_path):
    log = AckLog(tmp_path / "a", "feeder-0")
    acked(log, 0, 1, range(6), worker=1)
    log.fold(before=1)                                   # epoch 0 reported
    acked(log, 1, 1, [0, 1, 2, 4])                       # batch 3 in flight
    acked(log, 1, 2, [0], samples=7, worker=2)
    position = log.position_bytes()
    assert read_position(position)["parts"][1][1][:2] == (3, [4])
    seed(tmp_path / "b", "feeder-0", position)           # an empty disk, and the store's copy
    again = AckLog(tmp_path / "b", "feeder-0")
    assert again.restart() == log.restart()
    assert again.restart() == {"epochs": [0], "batches": 11, "samples": 107,
                               "loss_sum": 16.5, "weight_sum": 107.0, "last_epoch": 1,
                               "acked_by": {"worker-0": 40, "worker-1": 60, "worker-2": 7}}
    assert again.progress(1) == log.progress(1)
    (one, two) = (again.progress(1)[1], again.progress(1)[2])
    assert (one.low, one.above, one.samples, two.low) == (3, {4}, 40, 1)
    acked(again, 1, 1, [3])                              # goes on from it, as a log does
    assert (again.progress(1)[1].low, again.restart()["batches"]) == (5, 12)
    assert again.position_bytes() != position
    again.close()
    reopened = AckLog(tmp_path / "b", "feeder-0")        # the base and the records, from disk
    assert reopened.progress(1)[1].low == 5 and reopened.restart()["samples"] == 117
    snapshot = reopened.snapshot()                       # a checkpoint's copy keeps the base
    reopened.fold(before=2)                              # the base's epoch folded too
    assert reopened.progress(1) == {} and reopened.restart()["batches"] == 12
    assert reopened.restart()["epochs"] == [0, 1] and reopened.position()["parts"] == {}
    reopened.close()
    from roles.algorithms.feeding.ack_log import replace_files
    replace_files(tmp_path / "c", "feeder-0", snapshot)
    assert AckLog(tmp_path / "c", "feeder-0").progress(1)[1].low == 5


def test_the_compact_form_does_not_grow_with_the_batches_acknowledged(tmp_path):
    """Billions of rows: what the store gets is bounded by the parts and the batches in flight
    (those above each part's mark), not by how many were acknowledged."""
    sizes = []
    for batches in (100, 20_000):
        log = AckLog(tmp_path / str(batches), "feeder-0")
        for part in range(4):   # acks out of order within a window of 10; the last 3 in flight
            order = [s for block in range(0, batches, 10) for s in range(block + 9, block - 1, -1)]
            acked(log, 0, part, [s for s in order if s < batches - 3 and s != batches - 8],
                  worker=part)
        sizes.append(len(log.position_bytes()))
        log.close()
    assert sizes[1] < sizes[0] + 200, sizes              # the same gaps, whatever the count
    with pytest.raises(ValueError, match="compact form"):
        read_position(b'{"epochs": [], "batches": "many"}')


def test_the_copy_is_written_off_the_loop_once_per_interval_and_bounds_what_it_misses(
        tmp_path):
    log = AckLog(tmp_path / "log", "feeder-0")
    store = Store(str(tmp_path / "bucket"))
    stored = StoredAcks(store, "feeder-0", every_s=60.0, limit=40)   # the workers keep 40
    assert stored.read() is None and stored.room(19, log) and not stored.room(20, log)
    assert not stored.tick(0.0, log)                     # nothing acknowledged: no write
    acked(log, 0, 0, range(5))
    assert not stored.room(15, log) and stored.room(14, log)   # 5 acks not in the copy
    stored.tick(1.0, log)
    while stored.busy():                                 # written on a thread
        time.sleep(0.01)
        moved = stored.tick(1.0, log)
    assert moved and stored.unstored(log) == 0 and stored.room(19, log)
    assert read_position(stored.read() or b"")["batches"] == 5
    acked(log, 0, 0, range(5, 8))
    assert not stored.tick(2.0, log) and not stored.busy()    # not due for 60 s
    stored.tick(61.0, log)
    while stored.busy():
        time.sleep(0.01)
        stored.tick(61.0, log)
    assert read_position(stored.read() or b"")["batches"] == 8 and stored.writes == 2
    (tmp_path / "broken").write_text("a file, not a directory")
    failing = StoredAcks(Store(str(tmp_path / "broken")), "feeder-0", 60.0, 40)
    failing.tick(0.0, log)
    while failing.busy():
        time.sleep(0.01)
        failing.tick(1.0, log)
    assert failing.failing and failing.unstored(log) == 8 and not failing.room(12, log)


def ledger_side(job) -> LedgerSide:
    return LedgerSide(job, FeederTally(), for_mode(job), lambda: None, lambda *_: None,
                      lambda *_: None, lambda paused: None, lambda: None, 0.0)


def test_a_feeder_on_an_empty_disk_starts_from_the_copy_and_a_roll_back_replaces_it(
        tmp_path: Path):
    job = parse_job('[data]\nsource = "synthetic"\n')
    store = Store(str(tmp_path / "bucket"))
    first = AckLog(tmp_path / "old-pod", "feeder-0")
    acked(first, 0, 3, range(4), worker=1)
    StoredAcks(store, "feeder-0", 1.0, 40).write_now(first)

    side = ledger_side(job)                              # its pod made again: no log here
    side.open_ack_log(tmp_path / "new-pod", "feeder-0", False,
                      StoredAcks(store, "feeder-0", 1.0, 40))
    assert side.reclaim.restarted and side.tally.batches_acked == 4
    assert side.log().progress(0)[3].low == 4 and side.tally.acked_by == {"worker-1": 40}

    fresh = ledger_side(job)                             # the whole job back to a checkpoint:
    rolled = AckLog(tmp_path / "rolled", "feeder-0")     # its log as the checkpoint had it
    acked(rolled, 0, 3, range(2))
    rolled.close()
    fresh.open_ack_log(tmp_path / "rolled", "feeder-0", True,
                       StoredAcks(store, "feeder-0", 1.0, 40))
    assert not fresh.reclaim.restarted
    assert read_position(store.read_bytes("acks/feeder-0.json"))["batches"] == 2
