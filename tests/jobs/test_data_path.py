"""The data path over real processes on loopback: several feeders on assigned parts (every row
trained once per epoch, batch ids unique, each feeder reading only its parts, a lost feeder's
part fed on from where it was), embeddings pulled on demand, and what the workers receive."""

from __future__ import annotations

import signal
import time

import pytest
from harness import ADULT_JOB, ADULT_TEXT_EVAL_ROWS, ADULT_TEXT_TRAIN_ROWS, adult_text

ADULT_TRAIN_ROWS = ADULT_TEXT_TRAIN_ROWS   # adult_text: plain text, split by bytes
ADULT_ROWS = 48842
SLOW = {0: 13.0, 1: 13.0}  # idle workers: epochs of seconds, long enough to kill a feeder in


def assert_parts_cover(s: dict, feeders: int) -> None:
    p = s["parts"]
    assert p["parts"] == len(p["owners"]) and sorted(set(p["owners"])) == list(range(feeders))
    assert p["owners"] == sorted(p["owners"][:p["parts"] * 8 // 10]) + p["owners"][
        p["parts"] * 8 // 10:]  # consecutive training parts to each feeder


@pytest.mark.inprocess
@pytest.mark.parametrize("hold_mb", [0, 256])
def test_two_feeders_train_every_row_exactly_once_per_epoch(cluster, tmp_path, hold_mb):
    """With ``hold_mb`` = 0 every pass reads its parts from the file; with the default, each
    feeder reads each of its parts once and holds them (roles.data.held_parts)."""
    c = cluster(ADULT_JOB, cluster__feeders=2, data__path=adult_text(tmp_path),
                data__part_mb=0.5, data__hold_mb=hold_mb)
    assert c.run_job() == 0, c.logs()
    s = c.summary()
    assert s["ok"] and s["auc"] >= 0.895, s["auc"]
    assert_parts_cover(s, 2)
    assert s["parts"]["parts"] >= 8 and s["parts"]["feeders_lost"] == []
    for e in s["per_epoch"]:  # counted per batch from the acks, by the feeders
        assert (e["rows"], e["rows_once"], e["rows_repeated"], e["rows_missed"]) == (
            ADULT_TRAIN_ROWS, ADULT_TRAIN_ROWS, 0, 0), e
        assert e["eval_samples"] == s["eval_samples"] == ADULT_TEXT_EVAL_ROWS
    assert s["samples_trained"] == 3 * ADULT_TRAIN_ROWS
    fed = {f: v["samples_acked"] for f, v in s["feeders"].items()}
    assert sorted(fed) == ["feeder-0", "feeder-1"] and sum(fed.values()) == s["samples_trained"]
    assert min(fed.values()) > 0.35 * s["samples_trained"]  # about half each
    read = {f: v["bytes_read"] for f, v in s["feeders"].items()}
    size = (tmp_path / "adult.csv").stat().st_size
    held = {f: v["parts_read_from_memory"] for f, v in s["feeders"].items()}
    if hold_mb == 0:
        # each reads its own parts (3 epochs and 3 evaluations, and the statistics' sample)
        assert all(0.3 * 3 * size < b < 0.75 * 4 * size for b in read.values()), (read, size)
        assert held == {"feeder-0": 0, "feeder-1": 0}, held
    else:
        # each reads its own parts once (and the statistics' sample), every later pass
        # prepares them from memory: the first epoch's first parts_open (4) training parts,
        # read while the statistics were taken, then every part in the 2 epochs after
        assert all(0.3 * size < b < 0.75 * 2 * size for b in read.values()), (read, size)
        owners, n = s["parts"]["owners"], s["parts"]["parts"]
        parts = {f: owners.count(int(f[-1])) for f in held}
        training = {f: owners[:n * 8 // 10].count(int(f[-1])) for f in held}
        assert held == {f: min(4, training[f]) + 2 * parts[f] for f in held}, (held, parts)
        assert all(v["parts_held"] == parts[f] and 0 < v["held_mb"] < 10
                   for f, v in s["feeders"].items()), s["feeders"]
    assert s["duplicates_refused"]["embedding_updates"] == 0  # no batch id came twice
    for role in ("control-0", "feeder-0", "feeder-1", "worker-0", "worker-1"):
        assert "Traceback" not in c.log(role), c.log(role)


def mid_epoch(e: dict) -> bool:
    return e["event"] == "round_done" and e["round"] >= 3


@pytest.mark.inprocess
def test_a_feeder_lost_while_scoring_has_only_its_eval_part_scored_again(cluster, tmp_path):
    """Killed once its training pass is over (the job syncing or scoring), the feeder's parts
    go to the other one, which scores its eval part again and none of its training parts: the
    epoch's evaluation counts every eval row once (it had counted the training rows of the
    lost feeder's parts too)."""
    c = cluster(ADULT_JOB, train__epochs=2, cluster__feeders=2, cluster__node_timeout_s=1.5,
                data__path=adult_text(tmp_path), data__part_mb=0.5)
    c.start_all(slowdown=SLOW)
    deadline = time.monotonic() + 120
    while "epoch 1 trained" not in c.log("feeder-1"):  # the log counts epochs from 1
        assert time.monotonic() < deadline and c.procs["feeder-1"].poll() is None, c.logs()
        time.sleep(0.02)
    c.procs["feeder-1"].send_signal(signal.SIGKILL)
    assert c.wait() == 0, c.logs()
    s = c.summary()
    (lost,) = s["parts"]["feeders_lost"]
    assert lost["epoch"] == 0, lost
    first, second = s["per_epoch"]
    assert first["eval_samples"] == second["eval_samples"] == s["eval_samples"] \
        == ADULT_ROWS - ADULT_TRAIN_ROWS, s["per_epoch"]
    assert first["rows_once"] == second["rows_once"] == ADULT_TRAIN_ROWS


@pytest.mark.inprocess
def test_a_lost_feeders_part_is_fed_on_from_its_last_acknowledged_batch(cluster, tmp_path):
    c = cluster(ADULT_JOB, train__epochs=2, cluster__feeders=2, cluster__node_timeout_s=1.5,
                data__path=adult_text(tmp_path), data__part_mb=0.5)
    c.start_all(slowdown=SLOW)
    # a second into the epoch: the feeder has reported progress (it is resumed from its last
    # report)
    started = c.wait_for_event(lambda e: e["event"] == "epoch_start")["t"]
    c.wait_for_event(lambda e: mid_epoch(e) and e["t"] >= started + 1.0)
    c.procs["feeder-1"].send_signal(signal.SIGKILL)
    assert c.wait() == 0, c.logs()
    s = c.summary()
    lost = s["parts"]["feeders_lost"]
    assert [(x["feeder"], x["to"], x["epoch"]) for x in lost] == [
        ("feeder-1", [0] * len(lost[0]["parts"]), 0)], lost
    assert sum(lost[0]["acked_batches"].values()) > 0  # it had got somewhere
    assert set(s["parts"]["owners"]) == {0}
    first, second = s["per_epoch"]
    # nothing lost; what was acknowledged after its last report is trained again (bounded)
    assert first["rows"] == ADULT_TRAIN_ROWS and first["rows_missed"] == 0, first
    assert first["rows_once"] + first["rows_repeated"] == ADULT_TRAIN_ROWS
    assert (second["rows_once"], second["rows_repeated"], second["rows_missed"]) == (
        ADULT_TRAIN_ROWS, 0, 0), second
    assert second["eval_samples"] == s["eval_samples"]
    assert s["samples_trained"] == 2 * ADULT_TRAIN_ROWS  # from the feeders' epoch reports
    # the batches acknowledged after its last report went out again: the shards refused
    # their second embedding update (2 shards). The feeder reports every heartbeat (0.25 s
    # here), so they are about what is acknowledged in one: bounded by two heartbeats' worth
    # at the second epoch's rate and the batches in flight (feeding the part again from its
    # start would repeat all of its acknowledged batches)
    per_s = 153 / second["train_s"]
    assert s["duplicates_refused"]["embedding_updates"] / 2 <= 2 * 0.25 * per_s + 8, per_s
    assert s["auc"] >= 0.89
    assert "Traceback" not in c.log("feeder-0") + c.log("control-0")


@pytest.mark.inprocess
def test_pull_embeddings_train_adult_and_workers_receive_no_keys(cluster):
    c = cluster(ADULT_JOB, train__embeddings="pull", train__epochs=2)
    assert c.run_job() == 0, c.logs()
    s = c.summary()
    assert s["auc"] >= 0.895, s["auc"]
    e = s["embeddings"]
    assert e["mode"] == "pull" and sorted(e["workers"]) == ["worker-0", "worker-1"]
    assert sum(w["batches"] for w in e["workers"].values()) >= 2 * 153  # every batch waited
    assert e["median_ms"] > 0  # on demand, every batch waits for a round trip
    assert e["messages_per_batch"] == 4.0  # a look-up to each of 2 shards, a reply from each
    for worker, channels in s["worker_input_bytes_per_sample"].items():
        assert "keys" not in channels, (worker, channels)  # the worker never gets a key
        # 6 dense features, a label and a weight as float32, plus the header: ~34 bytes
        assert 32 <= channels["samples"] < 40, channels
        assert channels["embeddings"] > 0 and channels["total"] > channels["samples"]
