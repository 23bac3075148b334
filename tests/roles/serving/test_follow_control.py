"""A serving process that follows a job through its control (``zbus-serve --follow
tcp://host:port``): control says which job and where its checkpoints are, the server follows
it live, and every serving process that follows a job reports to control, whose status lists
it (the console's serving table)."""

from __future__ import annotations

import dataclasses
import time

import pytest
import zmq
from harness import adult_rows, first_status

from roles.protocol.serving import FollowJob, FollowRequest, ServerReport
from roles.serving.client import Client, request_body
from roles.testbed.jobs import ADULT_JOB
from roles.testbed.live_oracle import Asking
from roles.testbed.local_cluster import LocalCluster
from roles.testbed.serving import ServerThread
from roles.tools.keys import make_keys
from zbus import security
from zbus.codec import decode

pytestmark = pytest.mark.inprocess


def serving_rows(endpoint: str, want, timeout_s: float = 60.0, cluster=None) -> list[dict]:
    """The ``serving`` rows of the first status control publishes that ``want`` accepts."""
    return first_status(endpoint, lambda snap: want(snap["serving"]), timeout_s,
                        cluster)["serving"]


@pytest.mark.parametrize("curve", ["off", "on"])
def test_a_server_follows_control_live_and_control_lists_what_it_serves(tmp_path, curve):
    """With CURVE on, the server asks control and follows the shards with the operator's
    keys from ``--keys``."""
    keys = tmp_path / "keys"
    c = LocalCluster(tmp_path / "job", ADULT_JOB, in_process=True, transport="tcp",
                     train__epochs=2, checkpoint__every_s=0, serving__publish_ms=50,
                     cluster__curve=curve, cluster__keys_dir=str(keys))
    cl = c.job.cluster
    if curve == "on":
        make_keys(keys, [*cl.expected_nodes(), "control-0", security.OPERATOR])
    table = adult_rows(8)
    try:
        c.start_all()
        with ServerThread(follow=cl.endpoint("control_req"), poll_s=0.05,
                          keys_dir=str(keys) if curve == "on" else None) as server:
            c.wait_for_event(lambda e: e["event"] == "epoch_start" and e["epoch"] == 0)
            c.checkpoint()   # the base a live server joins on
            with c.paused():
                client, meta, versions = Client(server.url), None, set()
                deadline = time.monotonic() + 60
                live = set()
                while len(live) < 3 and time.monotonic() < deadline:
                    status, got = client.call("GET", "/v2/models/adult")
                    if status != 200:
                        time.sleep(0.05)
                        continue
                    meta = meta or got
                    status, reply = client.infer("adult", request_body(meta, table))
                    assert status == 200, reply
                    versions.add(reply["model_version"])
                    live = {v for v in versions if v.count(".") == 2}
                # the checkpoint (round.checkpoint), then live cuts (round.checkpoint.cut)
                assert len(live) >= 3, versions
                client.close()
                asking = Asking(table, pause_s=0.005)   # requests go on while control's status
                # is read
                asking.start(server.url)
                try:
                    rows = serving_rows(cl.endpoint("status"), lambda rows: any(
                        r["url"] == server.url and r["ready"] and r["requests_per_s"] > 0
                        for r in rows), cluster=cl if curve == "on" else None)
                finally:
                    asking.stop()
            (row,) = [r for r in rows if r["url"] == server.url]
            assert row["version"].count(".") == 2 and row["p50_ms"] is not None
            assert row["p99_ms"] >= row["p50_ms"] > 0 and row["rows_per_s"] > 0
            assert row["version_lag_s"] is not None and row["age_s"] < 10
            assert c.wait() == 0, c.logs()
    finally:
        c.close()


def test_control_answers_a_follow_request_and_takes_reports_without_answering(tmp_path):
    """On control's request endpoint: FollowRequest -> FollowJob (the run's job file and its
    checkpoints' place); a ServerReport gets no answer, a malformed one is counted and
    dropped, one of another run is not listed, and the job goes on."""
    c = LocalCluster(tmp_path / "job", ADULT_JOB, in_process=True, transport="tcp",
                     train__epochs=1)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        c.start_all()
        sock.connect(c.job.cluster.endpoint("control_req"))
        sock.send_multipart(FollowRequest(server="probe").encode("probe", 1)[0])
        assert sock.poll(20_000), "control did not answer the follow request"
        got = decode(sock.recv_multipart()).msg
        assert isinstance(got, FollowJob) and got.run_id == c.run_dir.name
        assert got.job_text == (c.run_dir / "config.toml").read_text()
        assert got.checkpoints == str(c.run_dir / "checkpoints")
        good = ServerReport(server="probe", run_id=got.run_id, url="http://x", version="",
                            ready=False, version_lag_s=-1.0, requests_per_s=0.0,
                            rows_per_s=0.0, p50_ms=-1.0, p99_ms=-1.0)
        bad = dataclasses.replace(good, requests_per_s=-5.0)
        sock.send_multipart(bad.encode("probe", 2)[0])
        # a server of another run (an old run directory followed) is not listed
        sock.send_multipart(dataclasses.replace(good, server="other", run_id="run-0").encode(
            "other", 3)[0])
        sock.send_multipart(good.encode("probe", 4)[0])
        rows = serving_rows(c.job.cluster.endpoint("status"), bool)
        assert [r["server"] for r in rows] == ["probe"] and rows[0]["p50_ms"] is None
        assert not sock.poll(500), "a report was answered"
        assert c.wait() == 0, c.logs()
        assert c.summary()["rejected_messages"], "the malformed report was not counted"
    finally:
        sock.close(0)
        ctx.term()
        c.close()
