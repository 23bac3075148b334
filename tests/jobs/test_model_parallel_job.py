"""A real job with one model-parallel group of two: Adult, the network split by the
partitioner, the cut tensors over the bus; the plan reaches control's status, the run
directory and the summary; a killed group member makes its group leave and the job fail
clearly. Its roles in this process, turned by one thread: the group's leader waits for its
member through the worker's loop, never blocking it."""

from __future__ import annotations

import signal
import time

import orjson
import pytest
from harness import REPO, first_status

MP_JOB = REPO / "jobs" / "adult_mp.toml"   # workers = 1, parts = 2


def model_status(endpoint: str, timeout_s: float = 120.0) -> dict:
    """partition.model of the first Status control publishes with one."""
    return first_status(endpoint, lambda snap: snap["partition"]["model"],
                        timeout_s)["partition"]["model"]


@pytest.mark.inprocess
def test_a_two_part_group_trains_adult(cluster):
    c = cluster(MP_JOB)
    c.start_all()
    model = model_status(c.job.cluster.endpoint("status"))
    assert c.wait(timeout=300) == 0, c.logs()
    s = c.summary()
    assert s["auc"] >= 0.89, s["auc"]
    mp = s["model_parallel"]
    assert model["parts"] == mp["parts"] == 2
    assert model["cut_critical"] == mp["cut_critical"] and len(model["load"]) == 2
    assert mp["nodes"][1], "the member process holds some of the network"
    # every training step of the group ran through the member process
    member = mp["members"]["member-0"]
    worker = s["workers"]["worker-0"]
    assert worker == s["samples_trained"]
    assert member["steps"] > 0 and member["scored"] > 0
    plan = orjson.loads((c.run_dir / "partition" / "plan.json").read_bytes())
    assert plan["owner"]["s0"] == 0 and plan["owner"]["output"] == 0
    assert sorted(plan["owner"]) == sorted(n for nodes in plan["nodes"] for n in nodes)
    assert any(e.get("event") == "model_plan" for e in c.events())


@pytest.mark.inprocess
def test_a_killed_member_ends_its_group_and_the_job_says_why(cluster):
    c = cluster(MP_JOB, train__epochs=50, cluster__node_timeout_s=2.0)
    c.start_all()
    c.wait_for_event(lambda e: e.get("event") == "epoch_start")
    time.sleep(1.0)
    c.procs["member-0"].send_signal(signal.SIGKILL)
    assert c.wait(timeout=120) != 0
    s = c.summary()
    assert s["status"] == "failed", s["reason"]
    assert "no live worker" in s["reason"], s["reason"]
    assert "model-parallel group 0" in c.log("control-0")
    assert c.procs["worker-0"].wait(timeout=30) == 1
