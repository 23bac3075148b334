"""Checkpoints and exports on object storage, against a local S3 server (moto's server mode on
loopback; ``roles/testbed/s3.py``): a job checkpoints to ``s3://``, is killed whole and
resumes from ``s3://`` with nothing left of its run directory (a machine, or a pod, that came
back empty); its export goes to ``s3://`` and ``zbus-predict`` scores from there; a
checkpoint cut off between its files and its manifest is never used. The job's roles run in
the test's process (a kill drops a role's sockets and frees what the kernel frees); the same
with processes, each pod on a disk of its own, is tests/processes/test_pods.py's."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from harness import ADULT_JOB, ADULT_TRAIN_ROWS, REPO
from resumes import checkpointed_while_paused, every_row_once, trained_past_a_checkpoint

from roles.algorithms.shard.applied import AppliedBatches
from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.checkpoint.files import (
    LATEST,
    latest_complete,
    prune,
    read_manifest,
    write_manifest,
)
from roles.checkpoint.shard import ShardCheckpoints, read_chain
from roles.serving.model import ExportedModel, fetched
from roles.storage.store import Store
from roles.tools.predict import predict as score


@pytest.fixture
def aws(s3, monkeypatch):
    """This process reaches the local S3 server as the roles do: the AWS variables."""
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    return s3


def predict(model: str) -> dict:
    """``zbus-predict MODEL adult.csv.gz --split eval`` (its parts, in this process): the
    model copied from ``s3://`` first, as the command does."""
    with tempfile.TemporaryDirectory(prefix="zbus-model-") as copy:
        exported = ExportedModel(fetched(model, Path(copy)))
    return score(exported, str(REPO / "data" / "adult.csv.gz"), exported.job.data.format,
                 "eval")


@pytest.mark.inprocess
def test_a_job_on_s3_killed_whole_resumes_from_s3_with_its_run_directory_gone(cluster, aws):
    checkpoints, exports = aws.fresh_prefix("checkpoints"), aws.fresh_prefix("exports")
    # 3 epochs, killed in the second: a checkpoint to s3:// must complete in it and training
    # go on past it before the job would end (2 epochs left too little of a window once the
    # bus and the evaluation got faster: the job ended first)
    # a cut begins every_s after the last ended: 2.5 s leaves a window for the kill after one
    # (``trained_past_a_checkpoint``) even when the polling of events lags under load
    c = cluster(ADULT_JOB, train__epochs=3, checkpoint__every_s=2.5,
                checkpoint__dir=checkpoints, checkpoint__export_dir=exports)
    c.env.update(aws.env)
    c.start_all(slowdown={0: 14.0, 1: 14.0})
    second = c.wait_for_event(lambda e: e["event"] == "epoch_start" and e["epoch"] == 1)
    trained_past_a_checkpoint(c, second["t"])
    c.kill_all()
    store = Store(checkpoints)
    before = latest_complete(store)
    assert before is not None and str(before[1]).startswith("s3://"), before
    # the parts were uploaded, not left behind: nothing of a checkpoint stays on the disk
    assert not [p for p in (c.run_dir / "checkpoints").rglob("*") if p.is_file()]
    shutil.rmtree(c.run_dir)          # new machines: no run directory, no shared filesystem
    c.start_all(resume=True, slowdown={0: 14.0, 1: 14.0})
    # the resumed run checkpoints on to s3:// (asked, while paused: it could end first)
    checkpointed_while_paused(c, before[0])
    assert c.wait() == 0, c.logs()
    s = c.summary()
    assert s["ok"], s["reason"]
    (back,) = s["checkpoints"]["rollbacks"]
    assert back["checkpoint"] == before[0], (back, before[0])
    assert "takes its records from checkpoint" in c.log("control-0")
    every_row_once(s, ADULT_TRAIN_ROWS, 3)
    assert s["duplicates_refused"]["embedding_updates"] == 0
    assert s["auc"] >= 0.9, s["auc"]
    # the resumed run checkpointed on to s3:// (the one asked above), its export is there too
    assert s["checkpoints"]["latest"] > back["checkpoint"]
    assert store.read_bytes(LATEST).decode() == f"{s['checkpoints']['latest']:06d}"
    export = f"{exports}/export"
    assert "manifest.json" in Store(export).files()
    scored = predict(export)
    assert abs(scored["auc"] - s["auc"]) < 1e-4, (scored["auc"], s["auc"])
    assert predict(checkpoints)["auc"] >= 0.89


def small_table(rows: int, seed: int) -> EmbeddingTable:
    t = EmbeddingTable(4, 0.1, 0.05, seed=seed, capacity=8)
    t.rows_for(np.random.default_rng(seed).choice(1 << 40, rows, replace=False)
               .astype(np.int64))
    return t


def written(shard: ShardCheckpoints, store: Store):
    """The part, once written and uploaded (the upload is on a thread)."""
    for _ in range(10_000):
        if (part := shard.poll(store)) is not None:
            return part
        time.sleep(0.01)
    raise AssertionError("the shard's part was not written within 100 s")


@pytest.mark.integration   # (the S3 server is a process)
def test_a_checkpoint_cut_off_between_its_files_and_its_manifest_is_never_used(aws, tmp_path):
    """On S3 nothing renames: a checkpoint is complete when its manifest exists, written
    after every file it lists, and LATEST after it. A shard's part goes up from the local
    staging directory (the forked writer never touches S3)."""
    store = Store(aws.fresh_prefix("cut"), tmp_path / "staging")
    table = small_table(200, 1)
    shard = ShardCheckpoints(0, table, full_every=8)
    parts = {}
    for number in (1, 2):
        shard.begin(number, store, AppliedBatches.of([number * 10]),
                    {"updates": number, "newest_epoch": 0, "version": 0, "table": {}})
        part = written(shard, store)
        assert part.ok, part.error
        parts[number] = part.files
        assert not list((tmp_path / "staging").rglob("*.npz"))  # uploaded, then removed
    write_manifest(store, 1, {"parts": {"ps-0": parts[1]}, "round": 1})
    # checkpoint 2: its file is there, its manifest never written (control killed)
    assert latest_complete(store)[0] == 1
    assert store.read_bytes(LATEST) == b"000001"
    got = read_chain(store, parts[1])
    by_row, live = table.key_of_row()
    assert np.array_equal(np.sort(got.keys), np.sort(by_row[live]))
    assert got.applied.tolist() == [10]
    # a manifest whose file is missing (or of another size) is not a checkpoint either
    write_manifest(store, 2, {"parts": {"ps-0": parts[2]}, "round": 2})
    assert latest_complete(store)[0] == 2
    store.remove(parts[2][-1])
    assert read_manifest(store.location("000002")) is None
    assert latest_complete(store)[0] == 1
    # pruning removes what no kept checkpoint reads, on S3 as on a disk
    for number in (3, 4):
        shard.force_full = True
        shard.begin(number, store, AppliedBatches(), {"updates": 0, "newest_epoch": 0, "version": 0,
                                            "table": {}})
        part = written(shard, store)
        write_manifest(store, number, {"parts": {"ps-0": part.files}, "round": number})
    assert prune(store, keep=1) == [1, 2, 3]
    assert [name for name in store.entries() if name.isdigit()] == ["000004"]
    assert latest_complete(store)[0] == 4
