"""The data path over real processes on loopback: several feeders on assigned slices (every row
trained once per epoch, batch ids unique, a lost feeder's slice fed on from where it was),
embeddings pulled on demand, and what the workers receive."""

from __future__ import annotations

import signal

import pytest
from harness import ADULT_JOB

pytestmark = pytest.mark.integration

ADULT_TRAIN_ROWS = 39074
SLOW = {"model__hidden": [512, 256]}  # epochs of seconds: long enough to kill a feeder in


def assert_slices_cover(s: dict, feeders: int) -> None:
    sl = s["slices"]
    for ranges, total in ((sl["train"], s["samples_in_data"]), (sl["eval"], s["eval_samples"])):
        assert len(ranges) == feeders
        assert ranges[0][0] == 0 and ranges[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False)), ranges


def test_two_feeders_train_every_row_exactly_once_per_epoch(cluster):
    c = cluster(ADULT_JOB, cluster__feeders=2)
    assert c.run_job() == 0, c.logs()
    s = c.summary()
    assert s["ok"] and s["auc"] >= 0.895, s["auc"]
    assert_slices_cover(s, 2)
    assert s["slices"]["owners"] == [0, 1] and s["slices"]["feeders_lost"] == []
    for e in s["per_epoch"]:  # counted from the acks, per row, by the feeders
        assert (e["rows"], e["rows_once"], e["rows_repeated"], e["rows_missed"]) == (
            ADULT_TRAIN_ROWS, ADULT_TRAIN_ROWS, 0, 0), e
        assert e["eval_samples"] == s["eval_samples"]
    assert s["samples_trained"] == 3 * ADULT_TRAIN_ROWS
    fed = {f: v["samples_acked"] for f, v in s["feeders"].items()}
    assert sorted(fed) == ["feeder-0", "feeder-1"] and sum(fed.values()) == s["samples_trained"]
    assert min(fed.values()) == 3 * (ADULT_TRAIN_ROWS // 2)
    assert s["duplicates_refused"]["embedding_updates"] == 0  # no batch id came twice
    for role in ("control-0", "feeder-0", "feeder-1", "worker-0", "worker-1"):
        assert "Traceback" not in c.log(role), c.log(role)


def mid_epoch(e: dict) -> bool:
    return e["event"] == "round_done" and e["round"] >= 3


def test_a_lost_feeders_slice_is_fed_on_from_its_last_acknowledged_batch(cluster):
    c = cluster(ADULT_JOB, train__epochs=2, cluster__feeders=2, cluster__node_timeout_s=1.5,
                **SLOW)
    c.start_all(slowdown={0: 4.0, 1: 4.0})
    # two heartbeats into the epoch: the feeder has reported progress (it is resumed from its
    # last heartbeat)
    started = c.wait_for_event(lambda e: e["event"] == "epoch_start")["t"]
    c.wait_for_event(lambda e: mid_epoch(e) and e["t"] >= started + 1.0)
    c.procs["feeder-1"].send_signal(signal.SIGKILL)
    assert c.wait() == 0, c.logs()
    s = c.summary()
    lost = s["slices"]["feeders_lost"]
    assert [(x["feeder"], x["slices"], x["to"], x["epoch"]) for x in lost] == [
        ("feeder-1", [1], [0], 0)], lost
    assert lost[0]["acked_batches"]["1"] > 0  # it had got somewhere: not fed from scratch
    assert s["slices"]["owners"] == [0, 0]
    first, second = s["per_epoch"]
    # nothing lost; what was acknowledged after its last heartbeat is trained again (bounded)
    assert first["rows"] == ADULT_TRAIN_ROWS and first["rows_missed"] == 0, first
    assert first["rows_once"] + first["rows_repeated"] == ADULT_TRAIN_ROWS
    assert first["rows_repeated"] < 0.1 * ADULT_TRAIN_ROWS, first
    assert (second["rows_once"], second["rows_repeated"], second["rows_missed"]) == (
        ADULT_TRAIN_ROWS, 0, 0), second
    assert second["eval_samples"] == s["eval_samples"]
    assert s["samples_trained"] == 2 * ADULT_TRAIN_ROWS  # from the feeders' epoch reports
    # the batches acknowledged after its last heartbeat went out again: the shards refused
    # their second embedding update (2 shards), a small share of the epoch's 153 batches
    assert s["duplicates_refused"]["embedding_updates"] / 2 < 0.1 * 153
    assert s["auc"] >= 0.89
    assert "Traceback" not in c.log("feeder-0") + c.log("control-0")


def test_pull_embeddings_train_adult_and_workers_receive_no_keys(cluster):
    c = cluster(ADULT_JOB, train__embeddings="pull", train__epochs=2)
    assert c.run_job() == 0, c.logs()
    s = c.summary()
    assert s["auc"] >= 0.895, s["auc"]
    e = s["embeddings"]
    assert e["mode"] == "pull" and sorted(e["workers"]) == ["worker-0", "worker-1"]
    assert sum(w["batches"] for w in e["workers"].values()) >= 2 * 153  # every batch waited
    assert e["median_ms"] > 0  # on demand, every batch waits for a round trip
    for worker, channels in s["worker_input_bytes_per_sample"].items():
        assert "keys" not in channels, (worker, channels)  # the worker never gets a key
        # 6 dense features, a label and a weight as float32, plus the header: ~34 bytes
        assert 32 <= channels["samples"] < 40, channels
        assert channels["embeddings"] > 0 and channels["total"] > channels["samples"]
