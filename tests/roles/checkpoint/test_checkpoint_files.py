"""Whole-job checkpoints on disk, without sockets: manifests and what makes a checkpoint
complete, pruning that keeps what the kept ones read, a shard's chain of full and incremental
files written by a forked child, a feeder's ack log put back, the resumed control's choice."""

from __future__ import annotations

import numpy as np
import pytest

from roles.algorithms.feeding.ack_log import AckLog
from roles.algorithms.shard.applied import AppliedBatches
from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.checkpoint.background import ForkedWrite, ThreadWrite
from roles.checkpoint.feeder import FeederCheckpoints
from roles.checkpoint.files import (
    checkpoint_dir,
    checkpoints_dir,
    latest_complete,
    prune,
    read_manifest,
    save_file,
    write_manifest,
)
from roles.checkpoint.shard import ShardCheckpoints, read_chain
from roles.control.resuming import Resuming
from roles.job.settings import JobError, parse_job
from roles.protocol.datapath import make_batch_id
from roles.storage.store import Store


def make_checkpoint(run_dir, number, parts):
    """A checkpoint whose nodes wrote ``parts`` (node -> {name: bytes} inside its dir)."""
    where = checkpoint_dir(run_dir, number)
    listed = {}
    for node, files in parts.items():
        for name, data in files.items():
            save_file(where / name, data)
        listed[node] = [f"{where.name}/{n}" for n in files]
    return where, listed


def test_a_checkpoint_is_complete_only_with_its_manifest_and_every_file_it_lists(tmp_path):
    where, listed = make_checkpoint(tmp_path, 1, {"ps-0": {"ps-0.npz": b"x" * 10}})
    assert read_manifest(where) is None and latest_complete(tmp_path) is None
    write_manifest(tmp_path, 1, {"parts": listed})
    assert read_manifest(where)["parts"] == listed
    assert latest_complete(tmp_path)[0] == 1
    assert (checkpoints_dir(tmp_path) / "LATEST").read_text() == "000001"
    (where / "ps-0.npz").write_bytes(b"x" * 9)  # a file cut short: not this checkpoint
    assert read_manifest(where) is None and latest_complete(tmp_path) is None
    (where / "ps-0.npz").unlink()
    assert read_manifest(where) is None


def test_the_newest_complete_checkpoint_is_used_not_a_newer_incomplete_one(tmp_path):
    for n in (1, 2):
        _, listed = make_checkpoint(tmp_path, n, {"ps-0": {"ps-0.npz": b"a"}})
        write_manifest(tmp_path, n, {"parts": listed})
    make_checkpoint(tmp_path, 3, {"ps-0": {"ps-0.npz": b"a"}})  # killed before its manifest
    number, where, _ = latest_complete(tmp_path)
    assert number == 2 and where == checkpoint_dir(tmp_path, 2)


def test_pruning_keeps_the_newest_and_the_older_files_they_read(tmp_path):
    _, one = make_checkpoint(tmp_path, 1, {"ps-0": {"ps-0.npz": b"full"}})
    write_manifest(tmp_path, 1, {"parts": one})
    _, two = make_checkpoint(tmp_path, 2, {"ps-0": {"ps-0.delta.npz": b"d2"}})
    write_manifest(tmp_path, 2, {"parts": {"ps-0": one["ps-0"] + two["ps-0"]}})
    make_checkpoint(tmp_path, 3, {"feeder-0": {"x": b"abandoned"}})
    _, four = make_checkpoint(tmp_path, 4, {"ps-0": {"ps-0.npz": b"full again"}})
    write_manifest(tmp_path, 4, {"parts": four})
    _, five = make_checkpoint(tmp_path, 5, {"ps-0": {"ps-0.delta.npz": b"d5"}})
    write_manifest(tmp_path, 5, {"parts": {"ps-0": four["ps-0"] + five["ps-0"]}})
    assert prune(tmp_path, keep=1) == [1, 2, 3]   # 5 reads 4; nothing reads 1-3
    assert read_manifest(checkpoint_dir(tmp_path, 5)) is not None
    _, six = make_checkpoint(tmp_path, 6, {"ps-0": {"ps-0.delta.npz": b"d6"}})
    write_manifest(tmp_path, 6, {"parts": {"ps-0": four["ps-0"] + five["ps-0"]
                                           + six["ps-0"]}})
    assert prune(tmp_path, keep=1) == []          # 6 reads 4 and 5


def table_with(keys, dim=4):
    t = EmbeddingTable(dim, 0.1, 0.05, seed=3, capacity=8)
    t.rows_for(np.asarray(keys, np.int64))
    return t


def as_dict(keys, weights):
    return {int(k): w.tolist() for k, w in zip(keys, weights, strict=True)}


def test_a_shards_chain_of_full_and_incremental_files_reads_back_its_table(tmp_path):
    root = checkpoints_dir(tmp_path)
    t = table_with(range(100))
    shard = ShardCheckpoints(0, t, full_every=3)
    applied = {make_batch_id(0, 0, s) for s in range(5)}
    done = AppliedBatches.of(applied)
    shard.begin(1, root, done, {"updates": 5, "newest_epoch": 0, "version": 0})
    t.adagrad(t.rows_for(np.arange(10, dtype=np.int64)), np.ones((10, 4), np.float32))
    first = wait_part(shard, root)
    assert first.ok and first.files == ["000001/ps-0.npz"] and first.info["kind"] == "full"
    assert t.dirty[:t.size].sum() == 10  # trained after the fork: marked for the next file
    # changed since: ten rows trained, five new keys
    t.rows_for(np.arange(100, 105, dtype=np.int64))
    shard.begin(2, root, AppliedBatches.of(applied | {make_batch_id(0, 0, 5)}),
                {"updates": 6, "newest_epoch": 0, "version": 0})
    second = wait_part(shard, root)
    assert second.files == ["000001/ps-0.npz", "000002/ps-0.delta.npz"]
    assert second.info["kind"] == "delta"
    got = read_chain(root, second.files)
    keys, rows = t.index.items()
    assert as_dict(got.keys, got.weights) == as_dict(keys, t.weights[rows])
    assert as_dict(got.keys, got.accum) == as_dict(keys, t.accum[rows])
    assert set(got.applied.tolist()) == applied | {make_batch_id(0, 0, 5)}
    # a delta holds only what changed: 15 rows, not 105
    with np.load(root / second.files[1]) as f:
        assert len(f["keys"]) == 15
    # every third file is whole again; rows renumbered (a handover) force a whole one too
    shard.begin(3, root, done, {"updates": 6, "newest_epoch": 0, "version": 0})
    assert wait_part(shard, root).info["kind"] == "delta"
    shard.begin(4, root, done, {"updates": 6, "newest_epoch": 0, "version": 0})
    assert wait_part(shard, root).info["kind"] == "full"
    t.release(np.isin(np.arange(t.size), [0, 1]))
    shard.begin(5, root, done, {"updates": 6, "newest_epoch": 0, "version": 1})
    fifth = wait_part(shard, root)
    assert fifth.info["kind"] == "full" and len(read_chain(root, fifth.files).keys) == 103


def wait_part(shard, root):
    shard.writing.writer.wait()
    part = shard.poll(root)
    assert part is not None
    return part


def test_a_chain_out_of_order_is_refused(tmp_path):
    root = checkpoints_dir(tmp_path)
    t = table_with(range(10))
    shard = ShardCheckpoints(0, t, full_every=8)
    shard.begin(1, root, AppliedBatches(), {"updates": 0, "newest_epoch": 0, "version": 0})
    one = wait_part(shard, root)
    shard.begin(2, root, AppliedBatches(), {"updates": 0, "newest_epoch": 0, "version": 0})
    two = wait_part(shard, root)
    with pytest.raises(ValueError, match="does not follow"):
        read_chain(root, two.files[1:])
    assert len(read_chain(root, one.files).keys) == 10


def test_a_failed_write_is_reported_and_the_next_file_is_whole(tmp_path):
    root = checkpoints_dir(tmp_path)
    t = table_with(range(10))
    shard = ShardCheckpoints(0, t, full_every=8)
    shard.begin(1, root, AppliedBatches(), {"updates": 0, "newest_epoch": 0, "version": 0})
    wait_part(shard, root)
    (root / "000002").write_text("a file where the directory should be")
    shard.begin(2, root, AppliedBatches(), {"updates": 0, "newest_epoch": 0, "version": 0})
    failed = wait_part(shard, root)
    assert not failed.ok and failed.files == [] and "Error" in failed.error
    (root / "000002").unlink()
    shard.begin(3, root, AppliedBatches(), {"updates": 0, "newest_epoch": 0, "version": 0})
    assert wait_part(shard, root).info["kind"] == "full"


def test_background_writes_report_their_errors():
    def boom():
        raise OSError("disk full")

    assert ForkedWrite(lambda: None).wait() == (True, "")
    ok, error = ForkedWrite(boom).wait()
    assert not ok and "disk full" in error
    ok, error = ThreadWrite(boom).wait()
    assert not ok and "disk full" in error


def test_a_feeders_log_goes_back_to_the_cut_and_says_what_is_trained_again(tmp_path):
    logs, run = tmp_path / "feeders", tmp_path / "run"
    log = AckLog(logs, "feeder-0")
    for seq in range(3):
        log.append(make_batch_id(1, 0, seq), 100, 1.0, 100.0, 0)
    store = Store(str(checkpoints_dir(run)))
    part = FeederCheckpoints(store, "feeder-0")
    part.begin(7, log, {"epoch": 1}, None)
    written = part.writing.writer.wait()
    assert written == (True, "")
    files = part.poll().files
    for seq in range(3, 5):  # acknowledged after the cut: lost with the rollback
        log.append(make_batch_id(1, 0, seq), 100, 1.0, 100.0, 1)
    log.close()
    position, retrained = FeederCheckpoints(store, "feeder-0").roll_back(store, files, logs)
    assert position == {"epoch": 1} and retrained == 200
    back = AckLog(logs, "feeder-0")
    assert back.restart()["samples"] == 300
    assert back.progress(1)[0].low == 3  # the pass resumes after the third batch


def test_a_control_with_records_from_a_checkpoint_refuses_rejoins_and_rolls_back():
    """Its run directory gone, control took its records from checkpoint 4: they are older than
    what a live node holds, so a rejoining node is refused (it is started again), and once
    every stateful node is new the job goes back to the checkpoint."""
    expected = ["feeder-0", "ps-0", "aggregator-0", "worker-0"]
    r = Resuming(expected, resumed=True)
    r.records_from(4)
    assert r.hello("ps-0", "ps", rejoin=True) == "refuse"
    assert r.hello("worker-0", "worker", rejoin=True) == "refuse"
    assert [r.hello(n, n.split("-")[0], rejoin=False) for n in
            ("ps-0", "feeder-0", "aggregator-0")] == ["wait", "wait", "roll back"]
    assert r.rolled_back and r.hello("worker-0", "worker", rejoin=False) == "go"


def test_a_resumed_control_goes_on_with_live_nodes_or_rolls_back_when_all_are_new():
    expected = ["feeder-0", "ps-0", "ps-1", "aggregator-0", "worker-0"]
    live = Resuming(expected, resumed=True)
    assert live.hello("ps-0", "ps", rejoin=False) == "wait"
    assert live.hello("worker-0", "worker", rejoin=True) == "go"  # someone lived on
    assert live.hello("ps-1", "ps", rejoin=False) == "go" and not live.rolled_back
    dead = Resuming(expected, resumed=True)
    assert [dead.hello(n, n.split("-")[0], rejoin=False) for n in
            ("worker-0", "ps-0", "ps-1", "feeder-0")] == ["wait"] * 4
    assert dead.hello("aggregator-0", "aggregator", rejoin=False) == "roll back"
    assert dead.rolled_back and dead.hello("worker-0", "worker", rejoin=False) == "go"
    fresh = Resuming(expected, resumed=False)
    assert fresh.hello("ps-0", "ps", rejoin=False) == "go" and not fresh.rolled_back


def test_a_control_that_started_its_run_anew_refuses_a_node_of_an_earlier_start():
    """A pod's run directory is always ``run``: control's pod stopped with no [checkpoint] dir
    to hand its records over to, its new pod starts the run anew; a node that lived on names
    the same run, yet its state is the earlier start's: refused, it joins anew once started
    again. A resumed control takes such rejoins."""
    fresh = Resuming(["feeder-0", "ps-0", "worker-0"], resumed=False)
    assert fresh.hello("ps-0", "ps", rejoin=True, known=False) == "refuse"
    assert fresh.hello("ps-0", "ps", rejoin=False, known=False) == "go"
    assert fresh.hello("ps-0", "ps", rejoin=True, known=True) == "go"   # its own, again
    resumed = Resuming(["feeder-0", "ps-0", "worker-0"], resumed=True)
    assert resumed.hello("worker-0", "worker", rejoin=True, known=False) == "go"
    assert resumed.hello("ps-0", "ps", rejoin=True, known=False) == "go"   # they live on


def test_the_old_shard_checkpoint_key_says_where_it_went():
    with pytest.raises(JobError, match=r"\[train\] checkpoint_s is now \[checkpoint\] every_s"):
        parse_job('name = "x"\n[train]\ncheckpoint_s = 5\n', "job.toml", None, {})


def test_a_restarted_writer_discards_only_what_its_killed_process_left_in_staging(tmp_path):
    """A killed shard leaves its staged part (never uploaded) and a half-written temporary
    file on its disk; the process started after it removes its own, and nothing of the
    others sharing the directory. On a local root the files are the checkpoint: only the
    temporary ones go."""
    staging = tmp_path / "staging"
    left = {"000002/ps-1.delta.npz", "000002/.ps-1.delta.npz.4242.tmp", "000001/ps-1.npz",
            "000003/.ps-1.npz.77.tmp"}
    kept = {"000002/ps-0.delta.npz", "000002/dense.npz", "000002/feeder-0/position.json",
            "000002/.ps-10.npz.5.tmp", "000002/ps-1.delta.npz.bak"}
    for name in left | kept:
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_bytes(b"x")
    mine = ShardCheckpoints(1, EmbeddingTable(4, 0.01, 0.1), 4).own_files()
    remote = Store("s3://bucket/run/checkpoints", staging)
    assert set(remote.discard_staged(mine)) == left
    assert {p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file()} \
        == kept
    assert remote.discard_staged(mine) == []
    (staging / "000004").mkdir()
    (staging / "000004/ps-1.npz").write_bytes(b"a checkpoint's part")
    (staging / "000004/.ps-1.npz.9.tmp").write_bytes(b"half")
    local = Store(str(staging))
    assert local.discard_staged(mine) == ["000004/.ps-1.npz.9.tmp"]
    assert (staging / "000004/ps-1.npz").read_bytes() == b"a checkpoint's part"
    assert Store("s3://bucket/x", tmp_path / "none").discard_staged(mine) == []
