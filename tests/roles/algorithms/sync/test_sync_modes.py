"""The sync modes' strategies, per role side (roles.algorithms.sync), without sockets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roles.algorithms.shared import live
from roles.algorithms.sync import aggregator as agg_sync
from roles.algorithms.sync import feeder as feeder_sync
from roles.algorithms.sync import worker as worker_sync
from roles.algorithms.worker.replica import NetworkWeights, Replica
from roles.job.settings import TrainConfig, parse_job
from roles.protocol.dense_sync import RoundDrained, RoundReady, StepGrad
from roles.protocol.operator import Settings
from zbus.codec import ProtocolError


def job(sync: str, **train):
    lines = "".join(f"{k} = {v}\n" for k, v in train.items())
    return parse_job(f"[data]\nsource = 'synthetic'\n[train]\nsync = '{sync}'\n{lines}",
                     environ={})


def replica(lr: float | None) -> Replica:
    torch.manual_seed(0)
    r = Replica(NetworkWeights(torch.nn.Linear(3, 1), torch.device("cpu")), lr)
    r.adopt(0, r.flat())  # the first weights
    return r


def train_step(r: Replica, strategy) -> StepGrad | None:
    """One batch: a backward pass, the mode's step, the replica counting it."""
    model = r.weights.model
    loss = model(torch.ones(2, 3)).sum()
    model.zero_grad()
    loss.backward()
    step = strategy.after_backward(r, 2.0)
    r.trained(2, 2.0)
    return step


def test_every_mode_has_a_strategy_on_every_side():
    modes = TrainConfig.__dataclass_fields__["sync"].metadata["choices"]
    assert modes == ("step", "every", "round", "lazy")
    expected = {  # (worker, feeder, aggregator): each mode's own strategies
        "step": (worker_sync.StepSync, feeder_sync.FreeFeeding, agg_sync.StepApplying),
        "every": (worker_sync.EverySync, feeder_sync.FreeFeeding, agg_sync.RoundsOnly),
        "round": (worker_sync.RoundSync, feeder_sync.RoundFeeding, agg_sync.RoundsOnly),
        "lazy": (worker_sync.LazySync, feeder_sync.FreeFeeding, agg_sync.RoundsOnly)}
    for mode in modes:
        j = job(mode)
        settings = live.LiveValues(j.aggregation)
        got = (worker_sync.for_mode(j.train, settings), feeder_sync.for_mode(j),
               agg_sync.for_mode(j.train, 4))
        assert tuple(type(g) for g in got) == expected[mode], (mode, got)


def test_step_sends_every_gradient_and_takes_no_local_step():
    s = worker_sync.for_mode(job("step").train, None)
    assert s.local_lr is None and not s.deltas
    r = replica(s.local_lr)
    before = r.flat()
    step = train_step(r, s)
    assert isinstance(step, StepGrad) and step.coefficient == 2.0
    assert step.grads.shape == (r.size,) and np.array_equal(r.flat(), before)
    assert s.due(r, 0) and s.trained(r) is None and s.starved(r) is None
    assert s.counters() == {"waits_at_max": 0}


def test_every_says_ready_once_per_round_after_sync_every_steps():
    t = job("every", sync_every=2, dense_lr=0.1).train
    s = worker_sync.for_mode(t, None)
    assert s.local_lr == 0.1 and s.deltas
    r = replica(s.local_lr)
    before = r.flat()
    assert train_step(r, s) is None and not np.array_equal(r.flat(), before)  # local Adam
    assert s.trained(r) is None                       # 1 step of 2
    train_step(r, s)
    assert s.trained(r) == RoundReady(round=1, steps=2, idle=False)
    train_step(r, s)
    assert s.trained(r) is None                       # said already for this round
    r.contribute(1, True)
    for _ in range(2):
        train_step(r, s)
    assert s.trained(r) == RoundReady(round=2, steps=2, idle=False)
    assert s.starved(r) is None


def test_round_trains_round_r_plus_one_only_once_round_r_is_contributed():
    s = worker_sync.for_mode(job("round").train, None)
    r = replica(s.local_lr)
    assert s.due(r, 1) and not s.due(r, 2)
    r.contribute(1, True)
    assert s.due(r, 2) and not s.due(r, 3)
    assert s.trained(r) is None and s.starved(r) is None


def test_lazy_reports_each_local_round_and_waits_at_the_maximum():
    j = job("lazy", sync_every=2)
    settings = live.LiveValues(j.aggregation)
    settings.take(Settings(version=1, values={"max_local_rounds": 2}))
    s = worker_sync.for_mode(j.train, settings)
    r = replica(s.local_lr)
    reports = []
    for _ in range(4):
        assert s.due(r, 0)
        train_step(r, s)
        reports.append(s.trained(r))
    assert reports[0] is None and reports[2] is None
    assert reports[1] == RoundReady(round=1, steps=2, idle=False)
    assert reports[3] == RoundReady(round=1, steps=4, idle=False)
    assert not s.due(r, 0) and s.counters() == {"waits_at_max": 1}
    settings.take(Settings(version=2, values={"max_local_rounds": 3}))  # a live change
    assert s.due(r, 0)
    assert s.starved(r) == RoundReady(round=1, steps=4, idle=True)


def test_round_feeding_releases_a_round_at_a_time_and_reports_it_drained():
    j = job("round", round_iterations=3)
    assert feeder_sync.for_mode(j).per_round == j.cluster.workers * 3
    f = feeder_sync.RoundFeeding(2)
    assert f.round_of(eval=False) == 1 and f.round_of(eval=True) == 0
    assert f.all_acked(eval=False) is None            # nothing sent in this round yet
    f.sent(eval=True)                                 # eval batches do not count
    f.sent(eval=False)
    assert not f.round_full()
    f.sent(eval=False)
    assert f.round_full()
    f.acked(5)
    f.acked(6)
    assert f.all_acked(eval=True) is None
    assert f.all_acked(eval=False) == RoundDrained(round=1, samples=11)
    assert not f.round_full() and f.round_of(eval=False) == 2
    assert f.all_acked(eval=False) is None


def test_round_feeding_puts_its_round_in_a_checkpoint_and_takes_it_back():
    f = feeder_sync.RoundFeeding(2)
    f.sent(eval=False)
    f.all_acked(eval=False)
    assert f.position() == {"sync_round": 2}
    again = feeder_sync.RoundFeeding(2)
    again.restore({"epoch": 1})                  # a checkpoint of another mode: round 1
    assert again.round_of(eval=False) == 1
    again.restore({"epoch": 1, **f.position()})
    assert again.round_of(eval=False) == 2


@pytest.mark.parametrize("mode", ["step", "every", "lazy"])
def test_other_modes_feed_freely(mode):
    f = feeder_sync.for_mode(job(mode))
    for _ in range(100):
        f.sent(eval=False)
        f.acked(3)
    assert not f.round_full() and f.round_of(eval=False) == 0
    assert f.all_acked(eval=False) is None
    assert f.position() == {}                    # nothing of theirs in a checkpoint
    f.restore({"epoch": 2, "sync_round": 7})
    assert f.round_of(eval=False) == 0


def test_the_aggregator_applies_step_gradients_only_in_mode_step():
    step = agg_sync.for_mode(job("step", dense_lr=0.1).train, 3)
    params = np.zeros(3, dtype=np.float32)
    new = step.apply_step(params, np.array([1.0, -1.0, 0.0], dtype=np.float32))
    assert new[0] < 0 < new[1] and new[2] == 0 and params[0] == 0
    with pytest.raises(ProtocolError) as bad:
        step.apply_step(params, np.zeros(4, dtype=np.float32))
    assert bad.value.kind == "bad_shape"
    for mode in ("every", "round", "lazy"):
        with pytest.raises(ProtocolError) as wrong:
            agg_sync.for_mode(job(mode).train, 3).apply_step(params, np.zeros(3, np.float32))
        assert wrong.value.kind == "wrong_mode"
