"""Heterogeneous and changing workers: the pull queue, the batch ledger, joining and leaving."""

from __future__ import annotations

import math
import signal

import pytest
from harness import ADULT_JOB

from roles.tools.ctl import request

ADULT_TRAIN_ROWS = 39074


def batches_per_epoch(rows: int, batch_size: int) -> int:
    return math.ceil(rows / batch_size)


def assert_every_batch_trained_once(s: dict, epochs: int, batch_size: int = 256) -> None:
    brief = {k: s[k] for k in ("status", "reason", "samples_trained", "samples_in_data",
                               "workers", "shards", "requeued_batches", "straggler_copies",
                               "duplicates_refused", "membership")}
    assert s["ok"], brief
    assert s["samples_trained"] == s["samples_in_data"] * epochs, brief
    assert sum(s["workers"].values()) == s["samples_trained"], brief
    batches = batches_per_epoch(s["samples_in_data"], batch_size) * epochs
    for figures in s["shards"].values():  # every batch updates every shard exactly once
        assert figures["updates"] == batches, brief


# Workers idling 13x (--slowdown) make an epoch last seconds: long enough to kill, stop or add
# a worker in it (one epoch shows every batch trained once across the change as two would).
SLOW = {0: 13.0, 1: 13.0}


@pytest.mark.integration
def test_a_faster_worker_takes_more_and_quality_holds(cluster):
    even = cluster(ADULT_JOB, in_process=True, cluster__shards=1)
    assert even.run_job() == 0, even.logs()
    uneven = cluster(ADULT_JOB, cluster__shards=1)
    # Both slowed, by idling, 20x and 60x (as scripts/bench_pull.py does, 2x and 6x there):
    # --slowdown stretches a batch's compute only, so a worker's batch takes its compute, its
    # idling and, besides, its waits for the feeder and the shard and its loop's own time,
    # which are the same for both and bring the split towards 1 : 1 (at 1x, on 2 cores with
    # load 10: 15 ms against 23 ms of compute, "3x slower" was ~2.1x). The uneven job's roles
    # are processes: the split is a property of workers that compute at the same time. In one
    # process their compute takes turns on one thread (the fast one waits out the slow one's),
    # and beside a busy core the split fell to 2.45-2.58 : 1 (AMD EPYC, 2 cores, a second
    # process spinning; 40x : 120x no better, 2.52), under the bar, where processes split
    # 2.82-2.89 : 1. (The even job, which only gives the AUC to hold, runs in this process.)
    assert uneven.run_job(slowdown={0: 20.0, 1: 60.0}) == 0, uneven.logs()
    s = uneven.summary()
    assert_every_batch_trained_once(s, epochs=3)
    fast, slow = s["workers"]["worker-0"], s["workers"]["worker-1"]
    # 3x slower: about a third of the fast one's batches, less what a pass's start and end
    # give the slow one (the bar, 1/2.5, is scripts/bench_pull.py's); an even split gives 1x
    assert fast >= 2.5 * slow, s["workers"]
    assert abs(s["auc"] - even.summary()["auc"]) <= 0.005, (s["auc"], even.summary()["auc"])


def mid_epoch(e: dict) -> bool:
    """The third aggregation round: well inside the first epoch (of about ten rounds)."""
    return e["event"] == "round_done" and e["round"] >= 3


@pytest.mark.inprocess
def test_a_killed_worker_loses_no_batch_and_none_is_trained_twice(cluster):
    c = cluster(ADULT_JOB, train__epochs=1, cluster__node_timeout_s=1.5)
    c.start_all(slowdown=SLOW)
    c.wait_for_event(mid_epoch)
    c.procs["worker-1"].send_signal(signal.SIGKILL)
    assert c.wait() == 0, c.logs()
    s = c.summary()
    assert_every_batch_trained_once(s, epochs=1)
    assert s["requeued_batches"] > 0  # the kill caught batches in flight
    assert s["auc"] >= 0.89
    assert [(m["node"], m["event"]) for m in s["membership"] if m["event"] != "joined"] == [
        ("worker-1", "failed")]


@pytest.mark.inprocess
def test_a_worker_stopped_with_sigterm_finishes_its_batches_and_leaves(cluster):
    c = cluster(ADULT_JOB, train__epochs=1)
    c.start_all(slowdown=SLOW)
    c.wait_for_event(mid_epoch)
    c.procs["worker-1"].send_signal(signal.SIGTERM)
    assert c.wait("worker-1", timeout=30) == 0, c.log("worker-1")
    assert c.wait() == 0, c.logs()
    s = c.summary()
    assert_every_batch_trained_once(s, epochs=1)
    left = [m for m in s["membership"] if m["event"] == "left"]
    assert [m["node"] for m in left] == ["worker-1"], s["membership"]
    assert s["workers"]["worker-1"] > 0, s["workers"]


@pytest.mark.inprocess
def test_a_worker_started_mid_job_joins_and_trains(cluster):
    c = cluster(ADULT_JOB, train__epochs=3)
    c.start_all(slowdown=SLOW)
    c.wait_for_event(lambda e: e["event"] == "epoch_start")
    # feeding paused while worker-2 starts, so that the job cannot end before it is in (on a
    # GPU the three epochs take less time than a worker's start)
    endpoint = c.job.cluster.endpoint("control_req")
    assert request(endpoint, "pause", timeout_s=20).ok
    c.start_role("worker", 2)
    c.wait_for_event(lambda e: e["event"] == "membership" and e["node"] == "worker-2")
    assert request(endpoint, "resume", timeout_s=20).ok
    assert c.wait() == 0, c.logs()
    s = c.summary()
    assert_every_batch_trained_once(s, epochs=3)
    assert s["workers"]["worker-2"] > 0
    assert ("worker-2", "joined") in [(m["node"], m["event"]) for m in s["membership"]]
    assert s["auc"] >= 0.895


@pytest.mark.inprocess
def test_round_mode_weighs_each_worker_by_its_samples_in_the_round(cluster):
    # a round of 2 x 32 batches: much more than a worker's pipeline and socket buffers hold
    # worker-1 3x slower, both idling so that their compute, not the feeder or the shard,
    # sets their pace (as on machines of different speeds)
    c = cluster(ADULT_JOB, train__sync="round", train__round_iterations=32, cluster__shards=1)
    assert c.run_job(slowdown={0: 4.0, 1: 12.0}) == 0, c.logs()
    s = c.summary()
    assert_every_batch_trained_once(s, epochs=3)
    assert s["auc"] >= 0.895
    per_round = [sum(ms) for ms in zip(*s["round_samples"].values(), strict=True)]
    full_round = 2 * 32 * 256
    assert per_round.count(full_round) >= len(per_round) - 3  # all but each epoch's last
    assert sum(per_round) == s["samples_trained"]
    fast, slow = (sum(s["round_samples"][w]) for w in ("worker-0", "worker-1"))
    assert fast > 1.5 * slow  # each round's tail evens the split out a little
    done = [e for e in c.events() if e["event"] == "round_done"]
    assert [sum(e["samples_by"].values()) for e in done] == per_round
