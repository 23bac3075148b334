"""The worker's parts without sockets: its pulled batches and embedding-wait sample, its links
to the feeders' ledgers, its place in the rounds, a batch's arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roles.algorithms.worker.feeder_links import FeederLinks
from roles.algorithms.worker.pulled import WAIT_REASONS, Pipeline, WaitClock, WaitSample
from roles.algorithms.worker.replica import (
    ADOPTED,
    RESTORED,
    STALE,
    NetworkWeights,
    Replica,
    WorkerRounds,
)
from roles.job.fields import FieldLayout
from roles.model.compute import BatchCompute
from roles.protocol.datapath import (
    Ack,
    Embeddings,
    Holding,
    PartMap,
    SampleBatch,
    Taken,
    make_batch_id,
)
from roles.protocol.dense_sync import Weights
from zbus.codec import ProtocolError

FIELDS, DIM = 2, 3
LAYOUT = FieldLayout.of(["a", "b"], {}, {}, DIM, {}, {}, {})


def sample(batch_id: int, n: int = 2, eval: bool = False, round_: int = 0) -> SampleBatch:
    return SampleBatch(batch_id=batch_id, epoch=0, eval=eval, min_round=0, round=round_,
                       dense=np.zeros((n, 1), np.float32), labels=np.ones(n, np.float32),
                       weights=np.ones(n, np.float32), lengths=np.zeros((n, 0), np.int32))


def reply(batch_id: int, positions: list[int], grid: int, rows: np.ndarray,
          inverse: list[int]) -> Embeddings:
    return Embeddings(batch_id=batch_id, grid=grid,
                      mask=Embeddings.mask_of(np.array(positions), grid),
                      inverse=np.array(inverse, np.int32), rows=rows.astype(np.float32))


def split_replies(batch_id: int, n: int = 2) -> list[Embeddings]:
    """Shard 0 holds field 0's run of the (field-major) grid, one row used by every sample;
    shard 1 holds field 1's, a row per sample."""
    grid = n * FIELDS
    even, odd = list(range(0, n)), list(range(n, grid))
    return [reply(batch_id, even, grid, np.ones((1, DIM)), [0] * len(even)),
            reply(batch_id, odd, grid, np.arange(len(odd) * DIM).reshape(-1, DIM),
                  list(range(len(odd))))]


# -- pulled batches ------------------------------------------------------------------------------
def test_only_the_next_batch_is_asked_for_and_a_copy_is_ignored():
    p = Pipeline(shards=2, layout=LAYOUT)
    a, b = p.pulled(sample(1)), p.pulled(sample(2))
    assert p.pulled(sample(1)) is None and len(p) == 2
    assert p.to_ask() is a and a.asked and p.to_ask() is None
    assert p.granted(1, True) and a.granted
    assert not p.granted(7, True)                 # not here
    assert p.granted(2, False) and len(p) == 1   # refused: another worker has it
    assert b not in list(p)


def test_up_to_grants_ahead_batches_are_asked_for_in_pull_order():
    """Two asked ahead: the third waits until one of them runs or is refused."""
    p = Pipeline(shards=2, layout=LAYOUT)
    a, b, c = (p.pulled(sample(i)) for i in (1, 2, 3))
    assert p.to_ask(ahead=2) is a and p.to_ask(ahead=2) is b and p.to_ask(ahead=2) is None
    assert not c.asked
    p.granted(2, True)
    for r, e in enumerate(split_replies(2)):
        p.embeddings(r, e)
    assert p.take_ready(lambda s: True) is b          # granted first: runs first
    assert p.to_ask(ahead=2) is c and p.to_ask(ahead=2) is None
    assert p.granted(1, False) and p.to_ask(ahead=2) is None   # refused: nothing left to ask


def test_a_copy_of_a_batch_running_unacknowledged_is_asked_for_only_after_its_ack():
    """Both copies of a straggler can reach one worker: the second, pulled while the first
    runs (its ack not sent: a slowed worker's outbox, a step waiting for the aggregator), is
    asked for only once the ack is out. Asked before it, the feeder (which counts the batch
    as this worker's) would not answer, and every batch behind it would wait for ever (the
    stall seen at checkpoints); after it, the feeder refuses the copy, or grants it when the
    part is fed again after its feeder died."""
    links = FeederLinks(feeders=1, acks_kept=4)
    links.owners = np.zeros(1, np.int64)
    p = Pipeline(shards=2, layout=LAYOUT)
    first = p.pulled(sample(1))
    assert p.to_ask(links.unacked) is first
    p.granted(1, True)
    for r, e in enumerate(split_replies(1)):
        p.embeddings(r, e)
    assert p.take_ready(lambda s: True) is first
    links.running(1)
    copy = p.pulled(sample(1))                        # the copy, while the first runs
    after = p.pulled(sample(2))
    assert copy is not None and p.to_ask(links.unacked) is after   # the next one is asked
    p.granted(2, True)
    assert p.to_ask(links.unacked) is None            # the copy waits for the ack
    links.acked(Ack(batch_id=1, samples=2, loss_sum=0.0, weight_sum=2.0,
                    preds=np.zeros(0, np.float32)))
    for r, e in enumerate(split_replies(2)):
        p.embeddings(r, e)
    assert p.take_ready(lambda s: True) is after      # the granted one runs first
    assert p.to_ask(links.unacked) is copy            # the ack is out: ask
    assert p.granted(1, False) and 1 not in p.batches   # refused: the copy goes


def test_a_batch_runs_once_granted_with_its_embeddings_when_due():
    p = Pipeline(shards=2, layout=LAYOUT)
    batch = p.pulled(sample(5, round_=2))
    due = lambda s: s.round <= 1  # noqa: E731
    p.granted(5, True)
    assert p.take_ready(due) is None and p.wanting_embeddings(due, 1.0) is None  # not due
    assert not p.ready(due)
    due = lambda s: True  # noqa: E731
    assert p.wanting_embeddings(due, 2.0) is batch and batch.needed_at == 2.0  # pull: ask
    batch.looked_up_at = 2.5
    assert p.wanting_embeddings(due, 3.0) is None and batch.needed_at == 2.0   # asked
    assert p.lacking(1) == [batch]
    r0, r1 = split_replies(5)
    assert p.embeddings(0, r0) is batch and not batch.has_embeddings()
    assert p.lacking(1) == [batch] and p.lacking(0) == []
    with pytest.raises(ProtocolError):
        p.embeddings(1, reply(5, [1], 3, np.ones((1, DIM)), [0]))  # another grid
    assert not p.ready(due)                       # one shard's rows are missing
    p.embeddings(1, r1)
    assert batch.complete() and p.holds_granted()
    assert p.ready(due) and p.first_ready(due) is batch and len(p) == 1   # looked, not taken
    assert p.take_ready(due) is batch and len(p) == 0 and not p.ready(due)
    assert p.embeddings(0, r0) is None            # gone meanwhile


def test_mode_push_asks_a_shard_only_when_its_rows_are_overdue_and_again_while_they_are():
    """The shards send the rows of a granted batch unasked; a reply that has not come
    ``after`` seconds after the batch was the next to run is asked for, and asked for again
    every ``after`` seconds while it does not come (a shard restarted at a new address pushes
    rows to a worker whose connection to it is not made yet: ZeroMQ drops them)."""
    p = Pipeline(shards=2, layout=LAYOUT)
    batch = p.pulled(sample(6))
    due = lambda s: True  # noqa: E731
    assert p.overdue(10.0, 2.0) is None                    # not the next to run yet
    p.granted(6, True)
    batch.looked_up_at = 1.0                               # Taken: the grant sends the rows
    assert p.wanting_embeddings(due, 2.0) is None and batch.needed_at == 2.0
    r0, _ = split_replies(6)
    p.embeddings(0, r0)
    assert p.overdue(3.9, 2.0) is None                     # not late yet
    assert p.overdue(4.0, 2.0) is batch and batch.replies[1] is None  # ask shard 1
    assert p.overdue(5.9, 2.0) is None                     # asked: not again at once
    assert p.overdue(6.0, 2.0) is batch                    # still not in: ask again
    p.embeddings(1, split_replies(6)[1])
    assert p.overdue(9.0, 2.0) is None                     # in: never again


def test_an_eval_batch_complete_but_for_its_weights_is_seen():
    p = Pipeline(shards=1, layout=LAYOUT)
    p.pulled(sample(8, eval=True))
    p.granted(8, True)
    assert not p.eval_waiting()
    p.embeddings(0, reply(8, [0, 1, 2, 3], 4, np.ones((1, DIM)), [0, 0, 0, 0]))
    assert p.eval_waiting()


def test_the_wait_sample_is_bounded_and_in_milliseconds():
    w = WaitSample(kept=4, seed=1)
    for i in range(100):
        w.add(i / 1000)
    assert w.seen == 100 and len(w.waits) == 4
    ms = w.milliseconds()
    assert ms == sorted(ms) and all(0 <= x <= 99 for x in ms)


def test_what_the_next_batch_waits_for_is_named_and_timed():
    p = Pipeline(shards=1, layout=LAYOUT)
    due = lambda s: s.round <= 0  # noqa: E731
    clock = WaitClock()
    clock.note(p.blocker(due), 0.0)
    assert p.blocker(due) == "samples"
    p.pulled(sample(3, round_=1))
    clock.note(p.blocker(due), 1.0)            # 1 s waiting for a sample
    assert p.blocker(due) == "grant"
    p.granted(3, True)
    clock.note(p.blocker(due), 1.5)            # 0.5 s for the grant
    assert p.blocker(due) == "embeddings"
    p.embeddings(0, reply(3, [0, 1, 2, 3], 4, np.ones((1, DIM)), [0, 0, 0, 0]))
    clock.note(p.blocker(due), 3.5)            # 2 s for the embeddings
    assert p.blocker(due) == "weights"
    clock.note(None, 6.5)                      # 3 s for the round's weights; then it runs
    clock.note("step", 7.0)                    # running is not waiting
    clock.note(None, 7.25)
    assert clock.seconds == {"samples": 1.0, "grant": 0.5, "embeddings": 2.0, "weights": 3.0,
                             "step": 0.25, "slowdown": 0.0}
    assert set(clock.rounded()) == set(WAIT_REASONS)


def test_the_summary_gives_waits_per_batch_over_all_workers():
    from roles.algorithms.control.summary import worker_waits
    waits = worker_waits({
        "worker-0": {"waiting_s": {"grant": 1.0, "weights": 0.5}, "batches_trained": 90,
                     "batches_scored": 10},
        "worker-1": {"waiting_s": {"grant": 3.0, "weights": 0.0}, "batches_trained": 100},
        "ps-0": {"waiting_s": {"grant": 100.0}}})
    assert waits["batches"] == 200 and set(waits["workers"]) == {"worker-0", "worker-1"}
    assert waits["ms_per_batch"] == {"grant": 20.0, "weights": 2.5}


# -- feeder links --------------------------------------------------------------------------------
def ack(batch_id: int) -> Ack:
    return Ack(batch_id=batch_id, samples=2, loss_sum=0.1, weight_sum=2.0,
               preds=np.zeros(0, np.float32))


def part_map(version: int, owners: list[int]) -> PartMap:
    parts = np.array([[i, 0, 10 * i, 10, 0, 0, 0] for i in range(len(owners))], np.int64)
    return PartMap(version=version, n_train=10 * len(owners), resume={},
                   body=PartMap.body_of([]), parts=parts, owners=np.array(owners, np.int32))


def test_a_restarted_feeder_is_told_its_acks_held_batches_and_unanswered_takes():
    links = FeederLinks(feeders=2, acks_kept=2)
    assert links.moved(part_map(0, [0, 1]), Pipeline(shards=1, layout=LAYOUT)) == []
    p = Pipeline(shards=1, layout=LAYOUT)
    ids = [make_batch_id(0, 1, i) for i in range(6)]   # part 1: feeder 1
    for b in ids[:3]:
        links.running(b)
        assert links.acked(ack(b)) == 1
    links.running(ids[3])                              # running, its ack not sent yet
    p.pulled(sample(ids[4]))
    p.pulled(sample(ids[5]))
    p.pulled(sample(make_batch_id(0, 0, 9)))           # feeder 0's
    p.granted(ids[4], True)
    p.batches[ids[5]].asked = True
    assert links.restart(1, 1) and not links.restart(1, 1) and not links.restart(5, 1)
    acks_, holding, taken = (lambda m: (m[:2], m[2], m[3:]))(links.restarted(1, p))
    assert [a.batch_id for a in acks_] == ids[1:3]     # the latest two kept
    assert isinstance(holding, Holding) and sorted(holding.held.tolist()) == ids[3:5]
    assert taken == [Taken(batch_id=ids[5])]


def test_a_part_moved_to_another_feeder_is_asked_of_it():
    """Asked or granted by the lost feeder, a batch is asked of the new one: a lost feeder's
    grant is void (the new one may grant the batch's copy to another worker, whose update
    leaves the shards without its keys: held, this grant would wait for ever)."""
    links = FeederLinks(feeders=2, acks_kept=2)
    p = Pipeline(shards=1, layout=LAYOUT)
    asked, granted = make_batch_id(0, 1, 0), make_batch_id(0, 1, 1)
    for b in (asked, granted):
        p.pulled(sample(b)).asked = True
    p.granted(granted, True)
    with pytest.raises(ProtocolError):
        links.feeder_of(asked)                         # no part map yet: no feeder
    assert links.moved(part_map(0, [0, 1]), p) == [] and links.feeder_of(asked) == 1
    assert not links.newer(part_map(0, [0, 0]))
    assert links.moved(part_map(1, [0, 0]), p) == [(0, Taken(batch_id=asked)),
                                                  (0, Taken(batch_id=granted))]
    assert not p.batches[granted].granted              # until the new feeder answers
    assert links.feeder_of(asked) == 0 and links.moved(part_map(2, [0, 0]), p) == []
    with pytest.raises(ProtocolError):
        links.feeder_of(make_batch_id(0, 7, 0))        # part 7: no such part


# -- rounds ----------------------------------------------------------------------------------------
def weights(round_: int, value: float, generation: int = 0, size: int = 4) -> Weights:
    return Weights(round=round_, step=0, generation=generation,
                   params=np.full(size, value, np.float32))


def test_rounds_defer_a_call_while_one_is_in_flight_and_follow_restores():
    r = Replica(NetworkWeights(torch.nn.Linear(3, 1), torch.device("cpu")), None)
    rounds = WorkerRounds(ask_every_s=2.0)
    with pytest.raises(ProtocolError):
        rounds.weights(r, weights(0, 0.0, size=5))
    assert rounds.weights(r, weights(0, 0.0)) == ADOPTED
    assert rounds.weights(r, weights(0, 1.0)) == STALE          # not newer
    assert rounds.called(r, 1)                                   # contribute now
    r.contribute(1, True)
    assert not rounds.called(r, 1)                               # a repeat
    assert not rounds.called(r, 2) and rounds.deferred == 2      # one round in flight
    assert rounds.missed(10.0, r, False)                         # ask for them
    rounds.asked_at = 10.0
    assert not rounds.missed(11.0, r, True)                      # asked just now
    assert rounds.weights(r, weights(1, 1.0)) == ADOPTED
    assert rounds.deferred_due(r) == 2 and rounds.deferred is None
    assert rounds.restore(1) and not rounds.restore(1)
    assert rounds.missed(20.0, r, False)                         # the restored weights
    assert rounds.weights(r, weights(0, 9.0, generation=1)) == RESTORED
    assert np.allclose(r.flat(), 9.0) and r.version == 0 and rounds.generation == 1
    assert rounds.weights(r, weights(5, 2.0, generation=0)) == STALE  # before the restore
    assert not rounds.missed(30.0, r, False) and rounds.missed(30.0, r, True)


# -- a batch's arithmetic -------------------------------------------------------------------
def test_a_batch_trains_on_its_grid_and_each_shard_gets_the_gradients_of_its_rows():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(FIELDS * DIM, 1))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, sparse, dense, lengths):
            return self.inner(torch.stack([sparse["a"], sparse["b"]], 1)).squeeze(1)

    net = Net()
    p = Pipeline(shards=2, layout=LAYOUT)
    batch = p.pulled(sample(3))
    for shard, e in enumerate(split_replies(3)):
        p.embeddings(shard, e)
    compute = BatchCompute(LAYOUT, torch.device("cpu"))
    flat = compute.grid(compute.gathered(batch.sample, batch.replies, batch.positions))
    assert flat.shape == (2 * FIELDS, DIM)
    grid = flat.reshape(2, FIELDS, DIM)   # every field single-valued: sample by sample
    assert grid[:, 0].eq(1).all() and grid[1, 1].tolist() == [3.0, 4.0, 5.0]
    loss, weight_sum, grads, _ = compute.train(net, batch)
    assert weight_sum == 2.0 and loss > 0
    w = model[1].weight.detach().reshape(FIELDS, DIM)
    with torch.no_grad():
        d = torch.sigmoid(model(grid).squeeze(1)) - 1        # d loss / d logit, label 1
    # shard 0's one row is used by field 0 of both samples: its gradient adds up
    assert np.allclose(grads[0], (w[0] * d.sum() / 2).numpy()[None], atol=1e-6)
    assert np.allclose(grads[1], (w[1][None] * d[:, None] / 2).numpy(), atol=1e-6)
    probs = compute.score(net, batch)
    assert probs.shape == (2,) and ((0 < probs) & (probs < 1)).all()


def test_the_warm_up_leaves_the_network_its_buffers_and_the_random_generator_as_they_were():
    class Net(torch.nn.Module):   # a batch norm's running statistics, a dropout's draws
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(FIELDS * DIM + 1)
            self.out = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(
                FIELDS * DIM + 1, 1))

        def forward(self, sparse, dense, lengths):
            x = torch.cat([sparse["a"], sparse["b"], dense], 1)
            return self.out(self.norm(x + 1.0)).squeeze(1)

    torch.manual_seed(0)
    net = Net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    rng = torch.get_rng_state()
    BatchCompute(LAYOUT, torch.device("cpu")).warm_up(net, samples=8, dense=1)
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), \
        [k for k in before if not torch.equal(before[k], after[k])]
    assert all(p.grad is None for p in net.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    net.train()   # (the check is not vacuous: a forward in training mode moves the statistics)
    net(*BatchCompute(LAYOUT, torch.device("cpu")).sparse.inputs(
        torch.ones((16, DIM)), 8, np.zeros((8, 0), np.int32))[:1], torch.ones(8, 1), {})
    assert not torch.equal(before["norm.running_mean"], net.state_dict()["norm.running_mean"])


def test_the_grid_gathers_every_shards_rows_and_a_position_no_shard_holds_reads_zeros():
    compute = BatchCompute(LAYOUT, torch.device("cpu"))
    replies = [reply(3, [0, 1], 4, np.ones((1, DIM)), [0, 0]),
               reply(3, [3], 4, np.arange(2 * DIM).reshape(-1, DIM), [1])]
    rows = compute.gathered(sample(3), replies, [np.array([0, 1]), np.array([3])])
    assert rows.starts == [0, 1, 3] and len(rows.rows) == 4   # 1 + 2 rows, then zeros
    flat = compute.grid(rows).numpy()   # sample by sample: (0, a), (0, b), (1, a), (1, b)
    assert (flat[[0, 2]] == 1).all()                             # positions 0 and 1: field a
    assert (flat[1] == 0).all()                                  # position 2: held by no shard
    assert flat[3].tolist() == [3.0, 4.0, 5.0]                   # position 3
    grads = compute.shard_grads(torch.ones((4, DIM)), rows)
    assert [g.shape for g in grads] == [(1, DIM), (2, DIM)]
    assert grads[0].tolist() == [[2.0] * DIM]                    # used twice: summed


# -- coalesced takes and the take window ----------------------------------------------------------
def test_an_ack_travels_with_its_takes_and_the_answers_together():
    from roles.protocol.datapath import MAX_TAKES, AckTaking, Grants, Taking
    from zbus.codec import decode
    a = ack(7)
    both = AckTaking.of(a, [8, 9])
    got = decode(both.to_frames("worker-0")).msg
    assert isinstance(got, AckTaking) and got.takes.tolist() == [8, 9]
    assert got.ack().batch_id == 7 and got.ack().samples == 2 and got.ack().loss_sum == 0.1
    taking = decode(Taking(takes=np.array([3, 4], np.int64)).to_frames()).msg
    assert isinstance(taking, Taking) and taking.takes.tolist() == [3, 4]
    grants = decode(Grants(batch_ids=np.array([3, 4], np.int64),
                           granted=np.array([1, 0], np.uint8)).to_frames()).msg
    assert isinstance(grants, Grants) and grants.answers() == [(3, True), (4, False)]
    bad = [AckTaking.of(a, []),                                  # no take: an Ack
           AckTaking.of(a, [8, 8]),                              # a batch twice
           Taking(takes=np.array([-1], np.int64)),               # not a batch id
           Taking(takes=np.arange(MAX_TAKES + 1, dtype=np.int64)),
           Grants(batch_ids=np.array([3, 4], np.int64), granted=np.array([1], np.uint8)),
           Grants(batch_ids=np.array([3], np.int64), granted=np.array([2], np.uint8))]
    for msg in bad:
        with pytest.raises(ProtocolError):
            decode(msg.to_frames())


def test_the_take_window_covers_the_round_trip_from_grants_ahead_to_what_can_be_pulled():
    from roles.algorithms.worker.window import KEPT, TakeWindow
    w = TakeWindow(most=8)
    assert w.ahead(2) == 2                       # nothing measured: grants_ahead
    w.answered(0.030)
    assert w.ahead(2) == 2                       # no batch time yet
    w.ran(0.010)
    assert w.ahead(2) == 4                       # ceil(30 / 10) + 1
    w.answered(0.001)                            # the least round trip is the link's
    assert w.ahead(2) == 2 and w.ahead(1) == 2   # ceil(1 / 10) + 1
    for _ in range(KEPT):                        # the short one ages out
        w.answered(0.200)
    assert w.ahead(2) == 8                       # at most what the worker can pull
    slow = TakeWindow(most=8)                    # a slow worker asks for the least
    slow.answered(0.030)
    slow.ran(1.0)
    assert slow.ahead(2) == 2 and slow.ahead(9) == 8
    assert slow.counters(2) == {"take_rtt_ms": 30.0, "batch_ms": 1000.0, "take_window": 2}


def test_the_sample_queue_gets_a_connection_per_half_batch_a_round_trip_needs():
    from roles.algorithms.worker.window import LINK_BATCHES_PER_RTT, TakeWindow
    assert LINK_BATCHES_PER_RTT == 0.5
    w = TakeWindow(most=3)
    assert w.links(4) == 1                       # nothing measured: one connection
    w.answered(0.005)
    assert w.links(4) == 1                       # no batch time yet
    w.ran(0.0025)
    assert w.links(8) == 4                       # 5 ms / 2.5 ms = 2 batches, 0.5 a connection
    assert w.links(3) == 3                       # at most ``most``
    w.answered(0.0002)                           # loopback: the least round trip
    assert w.links(8) == 1
    slow = TakeWindow(most=3)                    # a slow worker keeps one
    slow.answered(0.005)
    slow.ran(0.100)
    assert slow.links(8) == 1


def test_the_summary_gives_data_path_messages_per_batch_by_node():
    from roles.algorithms.control.summary import data_path_messages
    got = data_path_messages({
        "worker-0": {"batches_trained": 8, "batches_scored": 2,
                     "msgs_out": {"acks": 10, "lookups": 20, "control": 99},
                     "msgs_in": {"acks": 10, "samples": 10, "embeddings": 20}},
        "worker-1": {"batches_trained": 10, "msgs_out": {"acks": 20}, "msgs_in": {}},
        "feeder-0": {"msgs_out": {"samples": 20, "keys": 40, "acks": 20},
                     "msgs_in": {"acks": 30, "control": 5}},
        "control-0": {"msgs_out": {"control": 10}}})
    assert got["worker-0"] == {"sent": 3.0, "sent_acks": 1.0, "sent_lookups": 2.0,
                               "received": 4.0, "received_acks": 1.0,
                               "received_embeddings": 2.0, "received_samples": 1.0}
    assert got["worker-1"]["sent"] == 2.0 and got["worker-1"]["received"] == 0.0
    assert got["feeder-0"]["sent"] == 4.0 and got["feeder-0"]["received"] == 1.5
    assert "control-0" not in got


def test_mode_pull_sends_the_next_look_up_with_the_gradients():
    from roles.protocol.datapath import EmbeddingGrads, GradsLookup, Lookup
    from zbus.codec import decode
    grads = np.ones((2, DIM), np.float32)
    msg = decode(GradsLookup(batch_id=4, lookup=5, train=False, grads=grads).to_frames()).msg
    assert isinstance(msg, GradsLookup)
    first, then = msg.parts()
    assert isinstance(first, EmbeddingGrads) and first.batch_id == 4
    assert np.array_equal(first.grads, grads)
    assert then == Lookup(batch_id=5, train=False)
    for bad in (GradsLookup(batch_id=4, lookup=4, train=True, grads=grads),
                GradsLookup(batch_id=-1, lookup=5, train=True, grads=grads)):
        with pytest.raises(ProtocolError):
            decode(bad.to_frames())
