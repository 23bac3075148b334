"""``zbus-serve --follow RUN`` of a job that publishes its parameters at each serving cut
(``[serving] publish_ms``): a training job followed live, every answer checked against an
oracle that rebuilds the version it names from the published deltas alone (a dict of rows from
each shard process's first cut on, not the server's checkpoint and overlay), also while a shard
and the aggregator are killed and started again."""

from __future__ import annotations

import numpy as np
import pytest
from harness import adult_rows

from roles.serving import live as live_module
from roles.serving.model import ExportedModel
from roles.testbed.jobs import ADULT_JOB
from roles.testbed.live_oracle import Asking, Recorder, expected_answers, more_versions
from roles.testbed.local_cluster import LocalCluster
from roles.testbed.serving import ServerThread

pytestmark = pytest.mark.inprocess


@pytest.mark.parametrize("row_bytes", [4, 1])
def test_every_live_answer_is_the_parameters_of_the_cut_it_names(tmp_path, monkeypatch,
                                                                  row_bytes):
    """A job trains with a cut every 50 ms while the server follows it and is asked the same
    rows over and over, every 5 ms (back to back, the asking threads took two thirds of the
    test's CPU from the job they follow; scripts/bench_torn.py asks back to back); a second
    server starts mid-job (it loads the newest checkpoint and asks the shards for the rows
    changed since). Each answer of either names ``round.checkpoint.cut``; rebuilt from the
    deltas alone, that cut's rows and weights give exactly the answer. The servers fold their
    overlays into each newer checkpoint (joining again on it) as soon as it holds a quarter of
    the checkpoint's rows: on Adult's ~100 keys, every checkpoint, so the joins run again and
    again. (The checkpoints are asked for, and the waits for versions hold feeding paused, so
    that the job lasts what the test needs however fast the host trains; the cuts go on while
    it is paused.)"""
    monkeypatch.setattr(live_module, "REBASE_ROWS", 0)
    c = LocalCluster(tmp_path / "job", ADULT_JOB, in_process=True, train__epochs=2,
                     checkpoint__every_s=0, checkpoint__keep=1000, serving__publish_ms=50,
                     serving__row_bytes=row_bytes)
    recorder = Recorder(monkeypatch.setattr)
    table = adult_rows(8)
    asking = Asking(table, pause_s=0.005)
    late_answers: list[tuple[str, list[float]]] = []
    late = None
    try:
        (c.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        with ServerThread(follow=str(c.run_dir), poll_s=0.05) as server:
            answers = asking.start(server.url)
            c.start_all()
            c.wait_for_event(lambda e: e["event"] == "epoch_start" and e["epoch"] == 0)
            c.checkpoint()
            with c.paused():
                more_versions(c, answers, 10, 60)
                late = ServerThread(follow=str(c.run_dir), poll_s=0.05)
                late_answers = asking.start(late.url)
                more_versions(c, late_answers, 3, 60)   # the late server caught up, followed
            c.wait_for_event(lambda e: e["event"] == "epoch_start" and e["epoch"] == 1)
            c.checkpoint()
            with c.paused():
                more_versions(c, answers, 5, 60)
                more_versions(c, late_answers, 3, 60)
            c.checkpoint()
            with c.paused():
                more_versions(c, answers, 5, 60)
            assert c.wait() == 0, c.logs()
            asking.stop()
            follower = getattr(server.follower, "inner", None) or server.follower
    finally:
        asking.stop()
        if late is not None:
            late.close()
        c.close()
    live = sorted({v for v, _ in answers if v.count(".") == 2}, key=lambda v: int(v.split(".")[2]))
    assert len(live) >= 10, (live, follower.resyncs)   # it followed the job cut by cut
    late_live = {v for v, _ in late_answers if v.count(".") == 2}
    assert len(late_live) >= 3, late_live
    assert follower.joins >= 2 and not follower.resyncs, (follower.joins, follower.resyncs)
    expected = expected_answers(c, recorder, {v for v, _ in answers + late_answers}, table,
                                tmp_path / "rows.csv")
    for version, got in answers + late_answers:
        np.testing.assert_allclose(got, expected[version], rtol=0, atol=1e-6)
    assert not np.allclose(expected[live[0]], expected[live[-1]])   # it did train meanwhile
    sent = [m for m in recorder.rows if len(m.keys)]
    quantized = [len(m.qrows) == len(m.keys) and not len(m.rows) for m in sent]
    assert sent and all(quantized) if row_bytes == 1 else not any(quantized)


def test_answers_while_a_shard_and_the_aggregator_are_killed_are_their_versions_own(
        tmp_path, monkeypatch):
    """Never torn: ps-1, then the aggregator, SIGKILLed mid-job (mid-publish: cuts every 50 ms)
    and started again while the server follows the job and is asked the same rows over and
    over. The server joins again on each restarted shard (its rows went back to a checkpoint)
    and serves on; every answer is still exactly the parameters of the version it names,
    rebuilt from the deltas of the processes that published that cut."""
    c = LocalCluster(tmp_path / "job", ADULT_JOB, in_process=True, train__epochs=3,
                     checkpoint__every_s=1.0, checkpoint__keep=1000, serving__publish_ms=50,
                     cluster__node_timeout_s=2.0)
    recorder = Recorder(monkeypatch.setattr)
    table = adult_rows(8)
    asking = Asking(table, pause_s=0.005)
    try:
        (c.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        with ServerThread(follow=str(c.run_dir), poll_s=0.05) as server:
            answers = asking.start(server.url)
            c.start_all(slowdown={0: 6.0, 1: 6.0})
            c.wait_for_event(lambda e: e["event"] == "epoch_start")
            c.checkpoint()   # (every_s may not come round on a fast host before the kill)
            more_versions(c, answers, 10, 30)
            c.procs["ps-1"].kill()
            c.wait_for_event(lambda e: e["event"] == "shard_lost" and e["node"] == "ps-1")
            c.start_role("ps", 1, name="ps-1-again")
            recovered = c.wait_for_event(lambda e: e["event"] == "shard_recovered")
            with c.paused():   # (the job cannot end meanwhile; the cuts go on)
                more_versions(c, answers, 10, 30)
            c.procs["aggregator-0"].kill()
            c.start_role("aggregator", 0, name="aggregator-0-again")
            c.wait_for_event(lambda e: e["event"] == "restore")
            with c.paused():
                more_versions(c, answers, 10, 30)
            assert c.wait() == 0, c.logs()
            asking.stop()
            follower = getattr(server.follower, "inner", None) or server.follower
    finally:
        asking.stop()
        c.close()
    assert any("ps-1 was started again" in r for r in follower.resyncs), follower.resyncs
    first, again = recorder.incarnations(1)   # ps-1's rows went back to this checkpoint:
    restored = ExportedModel(c.run_dir / "checkpoints" / f"{recovered['checkpoint']:06d}")
    theirs = restored.owners.owner_of(restored.keys) == 1
    bases = {again: dict(zip(restored.keys[theirs].tolist(), restored.rows[theirs],
                             strict=True))}
    expected = expected_answers(c, recorder, {v for v, _ in answers}, table,
                                tmp_path / "rows.csv", bases)
    for version, got in answers:
        np.testing.assert_allclose(got, expected[version], rtol=0, atol=1e-6)
