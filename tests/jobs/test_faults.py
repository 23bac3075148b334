"""Faults: a parameter-server shard SIGKILLed mid-job and started again restores its latest
checkpoint and the job finishes, the updates it lost counted; the only feeder and control
killed and started again lose and double nothing; a stalled host fails no node. Every role
in the test's process (``roles.testbed.in_process``): a kill drops a role's sockets and frees
what the kernel frees of a killed process, SIGSTOP stops its turns."""

from __future__ import annotations

import signal
import time

import numpy as np
import orjson
import pytest
from harness import ADULT_JOB, ADULT_TEXT_TRAIN_ROWS, adult_text

from roles.checkpoint.files import checkpoint_dir, read_manifest
from roles.checkpoint.shard import read_chain

pytestmark = pytest.mark.inprocess

ADULT_TRAIN_ROWS = 39074


def mid_epoch(e: dict) -> bool:
    return e["event"] == "round_done" and e["round"] >= 3


def quiet(run_dir, number: int, still_s: float = 1.0, timeout: float = 30.0) -> None:
    """Until both shards have applied the same batches since checkpoint ``number``'s snapshot
    (their logs, ``roles.algorithms.shard.applied_log``) and neither applied another for
    ``still_s``: no gradient is on its way to either."""
    logs = [run_dir / "applied" / f"ps-{i}" / f"{number:06d}.ids" for i in (0, 1)]
    seen, since, deadline = None, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = [set(np.frombuffer(p.read_bytes(), "<i8").tolist()) for p in logs]
        if now != seen:
            seen, since = now, time.monotonic()
        elif now[0] == now[1] and time.monotonic() - since >= still_s:
            return
        time.sleep(0.05)
    raise AssertionError(f"the shards did not go quiet: {seen}")


def test_a_killed_shard_restarts_from_the_last_checkpoint_and_its_lost_updates_are_counted(
        cluster):
    """ps-1 is SIGKILLed after a whole-job checkpoint, with nothing in flight to it (the
    feeder paused a moment before and after, so that no gradient is on its way to the dying
    process: those would be lost uncounted). Started again, it restores that checkpoint; the
    updates its dead process applied after it are lost, and counted: ps-1 ends the job short
    of ps-0 (which got every batch's gradients too) by exactly that count. The feeder's ledger
    still has every sample trained once."""
    c = cluster(ADULT_JOB, train__epochs=2, checkpoint__every_s=1.5,
                checkpoint__keep=1000,  # the checkpoint restored is read back at the end
                cluster__node_timeout_s=3.0)
    c.start_all(slowdown={0: 28.0, 1: 28.0})  # epochs of several seconds
    c.wait_for_event(mid_epoch)
    done = c.wait_for_event(lambda e: e["event"] == "checkpoint" and e["status"] == "complete")
    time.sleep(0.5)                                   # updates after it: they will be lost
    c.procs["feeder-0"].send_signal(signal.SIGSTOP)   # nothing new; what is out gets done
    quiet(c.run_dir, done["number"])
    c.procs["ps-1"].send_signal(signal.SIGKILL)
    c.procs["ps-1"].wait()
    time.sleep(0.5)   # the workers' sockets have seen it go: what they send now waits for it
    c.procs["feeder-0"].send_signal(signal.SIGCONT)
    c.wait_for_event(lambda e: e["event"] == "shard_lost" and e["node"] == "ps-1", timeout=30)
    c.start_role("ps", 1, name="ps-1-again")
    assert c.wait() == 0, c.logs()
    s = c.summary()
    assert s["ok"] and s["auc"] >= 0.89, s["auc"]
    (r,) = s["shard_recoveries"]
    assert r["shard"] == "ps-1" and r["restored"], r
    back = c.log("ps-1-again")  # its rows came from the checkpoint seen before the kill
    restored = int(back.split("restored checkpoint ")[1].split()[0])
    assert restored == done["number"] == r["checkpoint"], (back, r)
    lost = r["updates_lost"]
    assert lost > 0, r
    # counted with every recovery, and said at the end with what it cost
    assert s["recovered"]["shard"] == 1 and s["recoveries"] == sum(s["recovered"].values())
    said = f"zbus: recovered from 1 shard restart (ps-1: {lost:,} embedding updates lost)"
    assert said in c.log("control-0"), c.log("control-0")[-2000:]
    assert "ps-1 is back after" in c.log("control-0") and " None " not in c.log("control-0")
    shards = s["shards"]
    # gradients sent for batches whose look-ups the dead process had answered reach the new
    # one without their keys unless the feeder sent those again: lost too, and counted
    late = shards["ps-1"]["grads_without_keys"]
    assert shards["ps-0"]["grads_without_keys"] == 0, shards
    assert shards["ps-1"]["updates"] + lost + late == shards["ps-0"]["updates"], (shards, r)
    assert s["samples_trained"] == 2 * ADULT_TRAIN_ROWS  # the ledger: no sample lost or twice
    assert s["duplicates_refused"]["embedding_updates"] == 0
    # the checkpoint it restored is whole: its chain of files reads back
    where = checkpoint_dir(c.run_dir, restored)
    manifest = read_manifest(where)
    assert manifest is not None
    rows = read_chain(where.parent, manifest["parts"]["ps-1"])
    assert len(rows.keys) == len(rows.weights) == len(rows.accum) > 0


@pytest.mark.parametrize("restart,data", [("after_detection", "gzip"), ("at_once", "gzip"),
                                          ("at_once", "parts")])
def test_a_killed_feeder_restarts_from_its_ack_log_losing_and_doubling_nothing(
        cluster, tmp_path, restart, data):
    """``gzip``: the shipped file, one part; ``parts``: the same rows as plain text, cut into
    parts of which a few are read at a time (the restarted feeder replays each part to where
    its ack log says)."""
    plain = {"data__path": adult_text(tmp_path), "data__part_mb": 0.5} if data == "parts" \
        else {}
    # at once: worker-1 is stopped until the new feeder is up, which on a busy machine takes
    # seconds (Python and its imports): node_timeout_s well above that, or worker-1 is failed
    c = cluster(ADULT_JOB, train__epochs=2, cluster__node_timeout_s=1.5 if restart ==
                "after_detection" else 30.0, **plain)
    c.start_all(slowdown={0: 10.0, 1: 10.0})
    c.wait_for_event(mid_epoch)
    if restart == "at_once":  # worker-1 keeps the batches granted to it until the new
        c.procs["worker-1"].send_signal(signal.SIGSTOP)  # feeder is up: it sends Holding
    c.procs["feeder-0"].send_signal(signal.SIGKILL)
    c.procs["feeder-0"].wait()
    if restart == "after_detection":  # the workers have drained what they held
        c.wait_for_event(lambda e: e["event"] == "feeder_down" and e["node"] == "feeder-0",
                         timeout=30)
    # at once: control learns of the restart from its Hello
    c.start_role("feeder", 0, name="feeder-0-again")
    if restart == "at_once":
        c.wait_for_event(lambda e: e["event"] == "feeder_back", timeout=30)
        c.procs["worker-1"].send_signal(signal.SIGCONT)
    assert c.wait() == 0, c.logs()
    s = c.summary()
    assert s["ok"] and s["auc"] >= 0.89, s["auc"]
    # no worker was failed, and every node sent its final counters
    assert not [e for e in s["membership"] if e["node"].startswith("worker-")
                and e["event"] != "joined"], s["membership"]
    assert s["counters_not_final"] == [], s["counters_not_final"]
    (r,) = s["parts"]["feeder_recoveries"]
    assert r["feeder"] == "feeder-0" and r["epoch"] == 0, r
    train_rows = ADULT_TEXT_TRAIN_ROWS if data == "parts" else ADULT_TRAIN_ROWS
    # every row of every epoch acknowledged exactly once, as the feeders count them ...
    for rows in s["parts"]["rows_per_epoch"]:
        assert rows["rows"] == rows["rows_once"] == train_rows, rows
    assert s["samples_trained"] == 2 * train_rows
    # ... and trained exactly once, as the workers and the shards count them
    assert s["samples_trained_by_workers"] == 2 * train_rows
    assert s["duplicates_refused"]["embedding_updates"] == 0
    assert "restarted: " in c.log("feeder-0-again")
    assert "feeding resumes" in c.log("feeder-0-again")


@pytest.mark.parametrize("down_s", [0.0, 4.5])
def test_a_killed_control_resumes_its_run_and_the_nodes_join_it_again(cluster, down_s):
    # down for longer than node_timeout_s: the resumed control fails no node for the silence
    # it did not hear (3 s: a busy machine's live feeder has missed 1.5)
    c = cluster(ADULT_JOB, train__epochs=2, cluster__node_timeout_s=3.0)
    c.start_all(slowdown={0: 10.0, 1: 10.0})
    c.wait_for_event(mid_epoch)
    c.procs["control-0"].send_signal(signal.SIGKILL)
    c.procs["control-0"].wait()
    time.sleep(down_s)  # the nodes go on meanwhile: their reports to control are lost
    state = orjson.loads((c.run_dir / "control-state.json").read_bytes())
    before = {"phase": state["course"]["phase"], "round": state["rounds"]["round"]}
    assert before["phase"] == "training" and before["round"] >= 3, before
    c.start_role("control", 0, "--resume")
    assert c.wait() == 0, c.logs()
    s = c.summary()
    assert s["ok"] and s["auc"] >= 0.89, s["auc"]
    assert s["epochs"] == 2 and s["rounds"] > before["round"]
    events = c.events()
    (resume,) = [e for e in events if e["event"] == "resume"]
    assert resume["epoch"] == 0 and resume["round"] >= before["round"]
    rejoined = {e["node"] for e in events if e["event"] == "rejoin"}
    assert rejoined == {"feeder-0", "aggregator-0", "ps-0", "ps-1", "worker-0", "worker-1"}
    # nothing lost, nothing trained twice, no node restarted
    for rows in s["parts"]["rows_per_epoch"]:
        assert rows["rows"] == rows["rows_once"] == ADULT_TRAIN_ROWS, rows
    assert s["samples_trained_by_workers"] == 2 * ADULT_TRAIN_ROWS
    assert s["duplicates_refused"]["embedding_updates"] == 0
    assert not [e for e in s["membership"] if e["event"] != "joined"], s["membership"]
    for name in ("feeder-0", "worker-0", "ps-0", "aggregator-0"):
        assert c.wait(name, timeout=30) == 0, name


def test_resume_refuses_a_run_that_ended_or_another_job(cluster):
    c = cluster(ADULT_JOB, train__epochs=1)
    assert c.run_job() == 0, c.logs()
    again = c.start_role("control", 0, "--resume", name="control-again")
    assert again.wait(timeout=60) == 2
    assert "has ended; there is nothing to resume (completed)" in c.log("control-again")
    c.env["ZBUS_TRAIN__EPOCHS"] = "2"  # another job: the refusal says what differs
    other = c.start_role("control", 0, "--resume", name="control-other")
    assert other.wait(timeout=60) == 2
    assert "ran another job ([train] epochs = 1 in the run, 2 now)" in c.log("control-other"), \
        c.log("control-other")


def test_a_stalled_host_fails_no_node(cluster):
    """Silences control could not have heard fail no node: first every node but control is
    stopped for longer than node_timeout_s (every node silent at once), then every process,
    control too (its own loop stalls; it is continued first, so it looks before they speak).
    Each stall gives the nodes a fresh timeout; the job finishes with its every node."""
    c = cluster(ADULT_JOB, train__epochs=2, cluster__node_timeout_s=5.0)
    c.start_all(slowdown={0: 10.0, 1: 10.0})
    c.wait_for_event(mid_epoch)
    nodes = [p for name, p in c.procs.items() if name != "control-0"]
    for p in nodes:
        p.send_signal(signal.SIGSTOP)
    # the first is due 4 to 5 s in (their last heartbeats, 1 s apart): control gives them all
    time.sleep(6.5)  # a fresh 5 s then, and they speak again well within it
    for p in nodes:
        p.send_signal(signal.SIGCONT)
    time.sleep(2.0)
    for p in [c.procs["control-0"], *nodes]:
        p.send_signal(signal.SIGSTOP)
    time.sleep(5.0)
    c.procs["control-0"].send_signal(signal.SIGCONT)
    time.sleep(0.5)
    for p in nodes:
        p.send_signal(signal.SIGCONT)
    assert c.wait() == 0, c.logs()
    s = c.summary()
    assert s["ok"], s["reason"]
    assert [e for e in s["membership"] if e["event"] != "joined"] == [], s["membership"]
    whys = [e["why"] for e in s["stalls"]]
    assert len(whys) == s["stalls_total"] == 2, whys
    assert whys[0].startswith("every live node went silent at once"), whys
    assert whys[1].startswith("control's own loop stalled"), whys
    assert "missed heartbeats" not in c.log("control-0")
