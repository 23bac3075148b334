"""The feeder's parts without sockets: its tally (and FeederProgress), its key routing and
counting per allocation window, a restarted feeder's reclaiming, its share of the parts."""

from __future__ import annotations

import numpy as np

from roles.algorithms.feeding.key_routing import COUNT_EVERY, KeyRouting, WindowCounter
from roles.algorithms.feeding.ledger import TAKEN, Ledger, PartProgress
from roles.algorithms.feeding.parts import FeederParts
from roles.algorithms.feeding.passes import FeedingPass, PartStream
from roles.algorithms.feeding.reclaim import Reclaim
from roles.algorithms.feeding.tally import FeederTally
from roles.algorithms.shared.key_map import KeyMap
from roles.algorithms.shared.metrics import auc
from roles.data.stream import Samples
from roles.job.fields import FieldLayout
from roles.job.settings import parse_job
from roles.protocol.datapath import FeederProgress, PartMap, make_batch_id
from roles.protocol.placement import Drained, Placement
from zbus.codec import decode


def job(text: str = ""):
    return parse_job(f"[data]\nsource = 'synthetic'\n{text}", environ={})


def singles(fields: int) -> FieldLayout:
    """A layout of ``fields`` single-valued fields."""
    return FieldLayout.of([f"f{i}" for i in range(fields)], {}, {}, 4, {}, {}, {})


def round_trip(msg):
    return decode([bytes(f) for f in msg.to_frames("feeder-0", 1)]).msg


def batch(n: int, first: int = 0, labels=None) -> Samples:
    keys = np.arange(first, first + n, dtype=np.int64).reshape(n, 1)
    y = np.zeros(n, np.float32) if labels is None else np.asarray(labels, np.float32)
    return Samples(keys, np.zeros((n, 1), np.float32), y, np.ones(n, np.float32))


def stream(part: int, sizes: list[int], done=None, made=None) -> PartStream:
    firsts = np.cumsum([0, *sizes])
    return PartStream(part, lambda: iter([batch(n, int(f)) for n, f in zip(sizes, firsts,
                                                                           strict=False)]),
                      done, made or (lambda *_: None))


# -- the tally ---------------------------------------------------------------------------------
def test_the_tally_adds_up_a_pass_and_reports_its_progress_per_part():
    t = FeederTally()
    t.new_epoch(3)
    t.new_pass()
    streams = []
    for part in (0, 1):
        assert t.part_planned(part, PartProgress(3)) is None  # afresh
        streams.append(stream(part, [5, 5, 5, 5], made=t.batches.made))
    plan = FeedingPass(3, False, streams)
    while plan.take() is not None:
        pass
    t.train_acked("worker-1", make_batch_id(3, 0, 0), 5, 2.0, 5.0)
    t.train_acked("worker-2", make_batch_id(3, 0, 2), 5, 1.0, 4.0)
    t.train_acked("worker-1", make_batch_id(3, 1, 0), 5, 0.5, 5.0)
    report = round_trip(t.progress_report())
    assert report == FeederProgress(epoch=3, batches_acked=3, parts=[0, 1], low=[1, 1],
                                    above=[[2], []], samples=[10, 5],
                                    loss_sum=[3.0, 0.5], weight_sum=[9.0, 5.0])
    assert report.of(0) == {"epoch": 3, "low": 1, "above": [2], "samples": 10,
                            "loss_sum": 3.0, "weight_sum": 9.0}
    c = t.counters()
    assert (c["batches_acked"], c["samples_acked"], c["epoch_samples"]) == (3, 15, 15)
    assert c["acked_by"] == {"worker-1": 10, "worker-2": 5} and c["train_loss_sum"] == 3.5
    trained = t.epoch_trained(plan, 1.5)
    assert (trained.samples, trained.batches, trained.rows, trained.rows_once,
            trained.rows_missed, trained.parts) == (15, 8, 40, 15, 25, [0, 1])


def test_a_resumed_part_skips_and_counts_what_was_acknowledged_before():
    t = FeederTally()
    t.new_epoch(0)
    t.new_pass()
    before = PartProgress(0, low=1, above={3}, samples=10, loss_sum=4.0, weight_sum=10.0)
    assert t.part_planned(0, before) == 2
    plan = FeedingPass(0, False, [stream(0, [5, 5, 5, 5], before, t.batches.made)])
    sent = [plan.take()[0] for _ in range(2)]
    assert sent == [make_batch_id(0, 0, 1), make_batch_id(0, 0, 2)] and plan.exhausted()
    assert (t.epoch_samples, t.loss_sum, t.weight_sum) == (10, 4.0, 10.0)
    for b in sent:
        t.train_acked("worker-0", b, 5, 1.0, 5.0)
    rows = t.batches.rows()
    assert (rows["rows"], rows["rows_once"], rows["rows_missed"]) == (20, 20, 0)
    assert round_trip(t.progress_report()).of(0)["low"] == 4


def test_a_restarted_feeders_tally_starts_from_its_ack_log_and_scores_eval_rows():
    t = FeederTally()
    t.restore({"batches": 3, "samples": 12, "loss_sum": 3.0, "weight_sum": 6.0,
               "acked_by": {"worker-0": 12}})
    assert (t.batches_acked, t.samples_acked, t.train_loss_sum, t.train_weight_sum) == \
        (3, 12, 3.0, 6.0)
    assert round_trip(t.progress_report()).parts == []  # nothing of a pass yet
    t.new_evaluation()
    t.eval_acked(np.array([0, 1], np.float32), np.array([0.3, 0.4], dtype=np.float32))
    t.eval_acked(np.array([0, 1], np.float32), np.array([0.1, 0.9], dtype=np.float32))
    r = round_trip(t.eval_report(FeedingPass(0, True, [stream(4, [2, 2])])))
    assert r.parts == [4] and int(r.counts.sum()) == 4 and t.batches_acked == 5
    assert t.scores.each[0].auc() == auc([0, 1, 0, 1], [0.3, 0.4, 0.1, 0.9])


# -- key routing ---------------------------------------------------------------------------------
def test_a_window_closes_after_its_batches_with_every_pair_counted():
    keymap = KeyMap.hashed(2, 4)
    counter = WindowCounter(heavy_keys=4, window_batches=COUNT_EVERY + 1, buckets=8, shards=2)
    keys = np.array([1, 1, 1, 2, 3, 8], dtype=np.int64)
    owner = keymap.owner_of(keys)
    for _ in range(COUNT_EVERY):
        assert counter.count(keys, owner, keymap, pass_end=False) is None
    closed = counter.count(keys, owner, keymap, pass_end=True)
    n = COUNT_EVERY + 1
    assert closed.window == 0 and counter.window == 1 and closed.pairs == 6 * n
    assert closed.keys[0] == 1 and closed.counts[0] == 3 * n
    assert closed.shard_pairs.sum() == closed.bucket_pairs.sum() == 6 * n
    assert closed.bucket_pairs[1] == 3 * n  # key 1 is in bucket 1
    assert counter.count(keys, owner, keymap, pass_end=False) is None  # a fresh window


def test_with_window_batches_zero_a_window_is_a_pass():
    keymap = KeyMap.hashed(2, 4)
    counter = WindowCounter(heavy_keys=4, window_batches=0, buckets=8, shards=2)
    keys = np.array([5, 6], dtype=np.int64)
    assert counter.count(keys, keymap.owner_of(keys), keymap, pass_end=False) is None
    closed = counter.count(keys, keymap.owner_of(keys), keymap, pass_end=True)
    assert closed.pairs == 4 and closed.version == 0


def test_hash_placement_neither_counts_nor_takes_placements():
    routing = KeyRouting(2, job().placement, singles(2))
    keys, owner, messages = routing.batch_keys(9, np.array([[0, 1], [6, 7]]), range(2))
    assert keys.tolist() == [0, 6, 1, 7] and owner.tolist() == [0, 0, 1, 1]   # field-major
    assert [m.positions.tolist() for m in messages] == [[0, 1], [2, 3]]
    assert [m.keys.tolist() for m in messages] == [[0, 6], [1, 7]]
    assert all(m.batch_id == 9 and m.samples == 2 and m.bounds == [0, 2, 4] for m in messages)
    assert routing.count(keys, owner, pass_end=True) is None
    assert not routing.newer(Placement(version=1, phase="drain", buckets=np.zeros(128, np.int64),
                                       keys=np.zeros(0, np.int64),
                                       owners=np.zeros(0, np.int64)))


def test_a_new_key_map_pauses_until_drained_then_routes_by_it():
    p = job("[placement]\nmode = 'skew'\nbuckets_per_shard = 2\n").placement
    routing = KeyRouting(2, p, singles(1))
    data = np.array([[4], [5]], dtype=np.int64)
    assert routing.batch_keys(1, data, range(2))[1].tolist() == [0, 1]
    buckets = np.array([1, 0, 1, 0], dtype=np.int64)  # every bucket moves
    drain = Placement(version=1, phase="drain", buckets=buckets, keys=np.zeros(0, np.int64),
                      owners=np.zeros(0, np.int64))
    assert routing.newer(drain) and routing.pause(1) and not routing.pause(1)
    assert routing.drained(in_flight=True) is None
    assert routing.drained(in_flight=False) == Drained(version=1)
    assert routing.drained(in_flight=False) is None  # said once
    active = Placement(version=1, phase="active", buckets=buckets, keys=np.array([5]),
                       owners=np.array([1]))
    routing.activate(active)
    assert routing.placing is None and routing.keymap.version == 1
    assert routing.batch_keys(1, data, range(2))[1].tolist() == [1, 1]
    assert not routing.newer(active)


# -- a restarted feeder reclaims ------------------------------------------------------------------
def test_a_restarted_feeder_reclaims_what_its_dead_process_sent():
    ledger = Ledger(max_in_flight=8)
    pass_ = FeedingPass(0, False, [stream(0, [10, 10, 10, 10])])
    fresh = Reclaim(ledger)
    assert fresh.reclaimable(pass_, make_batch_id(0, 0, 1)) is None  # not restarted
    r = Reclaim(ledger)
    r.restart()
    batch_id, sent = pass_.take()                 # sent by this process
    ledger.sent(batch_id, sent, False)
    assert r.reclaimable(pass_, batch_id) is None
    assert r.reclaimable(pass_, make_batch_id(1, 0, 1)) is None  # another epoch
    r.taking(pass_, make_batch_id(0, 0, 2))      # a worker asks for one the dead one sent
    assert make_batch_id(0, 0, 2) in ledger.in_flight
    r.holding(pass_, "worker-1", [make_batch_id(0, 0, 3), batch_id])
    for b in (make_batch_id(0, 0, 3), batch_id):
        assert (ledger.in_flight[b].state, ledger.in_flight[b].worker) == (TAKEN, "worker-1")
    assert pass_.take()[0] == make_batch_id(0, 0, 1)  # 2 and 3 are out: not sent again
    assert pass_.exhausted()
    r.deferred_takes.append((b"worker-2", make_batch_id(0, 0, 2)))
    assert r.recovered(None) is None              # membership not known yet
    assert r.recovered({"worker-1", "worker-2"}) is None
    r.holding(pass_, "worker-2", [])
    assert r.recovered({"worker-1", "worker-2"}) == [(b"worker-2", make_batch_id(0, 0, 2))]
    assert not r.recovering and r.deferred_takes == [] and r.recovered({"worker-1"}) is None


def test_a_restarted_feeder_says_which_of_its_dead_processs_batches_it_takes_back(tmp_path):
    """A batch the dead process had sent that a worker holds or asks for, during the recovery
    or after it, is taken back for that worker to train: ``reclaimed`` is told, so that the
    feeder sends its keys again to a shard restarted meanwhile (the dead process had sent them
    to the shard's dead process: a worker's look-up there would wait for ever). Not for an
    ack (the batch is trained), nor for a batch this process sent."""
    from roles.algorithms.feeding.ack_log import AckLog
    from roles.algorithms.sync.feeder import for_mode
    from roles.feeder.ledger_side import LedgerSide

    job = parse_job('[data]\nsource = "synthetic"\n')
    pass_ = FeedingPass(0, False, [stream(0, [10, 10, 10, 10])])
    log = AckLog(tmp_path, "feeder-0")
    log.append(make_batch_id(0, 0, 0), 10, 1.0, 10.0, 0)   # the dead process's ack log
    log.close()
    seen = []
    side = LedgerSide(job, FeederTally(), for_mode(job), lambda: pass_, lambda *_: None,
                      lambda *_: None, lambda paused: None, lambda: None, 0.0,
                      reclaimed=lambda batch_id, entry: seen.append(batch_id))
    side.open_ack_log(tmp_path, "feeder-0", rolled_back=False)
    assert side.recovering()
    side.membership(1, {"worker-0", "worker-1"})
    side.taken(b"worker-0", make_batch_id(0, 0, 2))   # asked of the dead process: deferred
    side.holding("worker-0", [])
    side.holding("worker-1", [make_batch_id(0, 0, 3)])   # granted by the dead process
    assert not side.recovering()
    assert seen == [make_batch_id(0, 0, 3), make_batch_id(0, 0, 2)]
    side.taken(b"worker-1", make_batch_id(0, 0, 1))   # pulled from the dead one, asked now
    assert seen[-1] == make_batch_id(0, 0, 1) and len(seen) == 3
    side.taken(b"worker-0", make_batch_id(0, 0, 1))   # in flight already: not again
    assert len(seen) == 3


def test_an_ack_the_dead_process_never_saw_is_reclaimed_as_the_workers():
    ledger = Ledger(max_in_flight=8)
    pass_ = FeedingPass(0, False, [stream(0, [10, 10])])
    r = Reclaim(ledger)
    r.restart()
    b = make_batch_id(0, 0, 1)
    entry = r.reclaimable(pass_, b)
    assert len(entry.batch) == 10 and r.reclaimable(pass_, b) is not None  # peeked, kept
    r.reclaim(pass_, b, entry, "worker-0")
    assert ledger.acked(b, "worker-0") is entry and r.reclaimable(pass_, b) is None


# -- parts ----------------------------------------------------------------------------------------
def part_map(version: int, owners: list[int], resume: dict | None = None) -> PartMap:
    parts = np.array([[0, 0, 0, 30, 0, 300, 0], [1, 0, 30, 30, 300, 600, 0],
                      [2, 0, 60, 10, 600, 700, 1]], np.int64)
    return PartMap(version=version, n_train=60, resume=resume or {},
                   body=PartMap.body_of([{"path": "d.csv", "size": 700}]), parts=parts,
                   owners=np.array(owners, np.int32))


def test_a_feeder_reads_its_parts_and_takes_over_a_lost_ones_from_where_it_had_got():
    parts = FeederParts(0)
    assert parts.take(part_map(0, [0, 1, 1])) == [] and parts.mine() == [0]
    assert parts.mine(eval=True) == [] and parts.mine(eval=False) == [0]
    resume = {"1": {"epoch": 2, "low": 1, "above": [2], "samples": 20, "loss_sum": 1.0,
                    "weight_sum": 20.0}}
    assert parts.take(part_map(1, [0, 0, 0], resume)) == [1, 2]
    assert parts.handed_over(1) and not parts.scoring(1)
    progress = parts.resumed(1, 2)
    assert (progress.low, progress.above, progress.samples) == (1, {2}, 20)
    assert parts.resumed(1, 3) is None and parts.resumed(0, 2) is None
    assert "eval rows 60..70 of file 0" in parts.describe([2])
    # consecutive parts of one kind and file in one phrase: a line, however many parts
    assert parts.describe([0, 1, 2]) == ("0-1 (training rows 0..60 of file 0), "
                                         "2 (eval rows 60..70 of file 0)")


def test_only_the_eval_parts_of_a_feeder_lost_while_scoring_are_scored_again():
    """Lost in an eval pass, a feeder's parts all come with phase "evaluating": its eval part is
    scored again by the new owner, its training parts are not (they were, and the epoch's eval
    counted every training row of them too)."""
    parts = FeederParts(0)
    parts.take(part_map(0, [0, 1, 1]))
    resume = {str(n): {"epoch": 2, "phase": "evaluating", "reported": True} for n in (1, 2)}
    parts.take(part_map(1, [0, 0, 0], resume))
    assert parts.scoring(2) and not parts.scoring(1) and not parts.scoring(0)
