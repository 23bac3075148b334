"""Bounded tables with whole-job checkpoints (every role in the test's process: a kill drops
its sockets and frees what the kernel frees): a shard killed and started again, and a whole
job killed and resumed, with admission and expiry on. The chain of
files a shard restores holds the table as it stood at the cut — the keys expired since its full
file stay dropped — its default rows and its counts, which the restored shard goes on from;
``zbus-predict`` scores a checkpoint with the default rows."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from harness import ADULT_JOB
from resumes import checkpoint_auc, every_row_once, killed_and_resumed

from roles.checkpoint.files import (
    checkpoint_dir,
    checkpoints_dir,
    latest_complete,
    read_manifest,
    read_meta,
)
from roles.checkpoint.shard import read_chain
from roles.serving.model import ExportedModel

pytestmark = pytest.mark.inprocess

ADULT_TRAIN_ROWS = 39074
BOUNDED = {"embeddings__min_count": 3,
           "embeddings__expire_batches": 30,
           "checkpoint__keep": 1000}   # the files read after the job are not pruned meanwhile


def chain_of(run_dir, number: int, node: str) -> list[str]:
    manifest = read_manifest(checkpoint_dir(run_dir, number))
    assert manifest is not None
    return manifest["parts"][node]


def last_meta(run_dir, files: list[str]) -> dict:
    with np.load(checkpoints_dir(run_dir) / files[-1]) as f:
        return read_meta(f)


def dropped_after_full(run_dir, files: list[str]) -> set[int]:
    """The keys a chain's deltas dropped and did not bring back later in the chain."""
    gone: set[int] = set()
    for name in files[1:]:
        with np.load(checkpoints_dir(run_dir) / name) as f:
            gone = (gone | set(f["dropped"].tolist())) - set(f["keys"].tolist())
    return gone


def with_drops(run_dir, e: dict) -> bool:
    """A complete checkpoint whose shards' chains have dropped keys in a delta."""
    if e["event"] != "checkpoint" or e["status"] != "complete":
        return False
    return any(dropped_after_full(run_dir, chain_of(run_dir, e["number"], f"ps-{i}"))
               for i in range(2))


def restored_number(log: str) -> tuple[int, int]:
    """(checkpoint, keys) from a shard's 'restored checkpoint N of S s ago: K keys'."""
    rest = log.split("restored checkpoint ")[1]
    return int(rest.split()[0]), int(rest.split(": ")[1].split()[0])


def test_whole_job_killed_with_expiry_on_resumes_and_no_dropped_key_comes_back(cluster):
    c = cluster(ADULT_JOB, train__epochs=4, checkpoint__every_s=1.0, checkpoint__full_every=50,
                **{**BOUNDED, "embeddings__expire_batches": 10})
    c.start_all(slowdown={0: 10.0, 1: 10.0})
    second = c.wait_for_event(lambda e: e["event"] == "epoch_start" and e["epoch"] == 1)
    cut = c.wait_for_event(lambda e: e["t"] > second["t"] and with_drops(c.run_dir, e),
                           timeout=180)
    s = killed_and_resumed(c, 10.0)
    number = s["checkpoints"]["rollbacks"][0]["checkpoint"]
    assert number >= cut["number"]
    chains = {f"ps-{i}": chain_of(c.run_dir, number, f"ps-{i}") for i in range(2)}
    expired: dict[str, int] = {}
    for node, files in chains.items():
        meta = last_meta(c.run_dir, files)
        got = read_chain(checkpoints_dir(c.run_dir), files)
        # the chain gives the table as it stood at the cut: as many keys, none it had dropped
        assert len(got.keys) == meta["keys"] == len(set(got.keys.tolist())), node
        if len(files) > 1:
            with np.load(checkpoints_dir(c.run_dir) / files[0]) as f:
                full_keys = set(f["keys"][f["live"]].tolist())
            gone = dropped_after_full(c.run_dir, files) & full_keys
            assert not gone & set(got.keys.tolist()), node
        assert got.default_weights.shape == (8, 16) and np.abs(got.default_weights).sum() > 0
        assert restored_number(c.log(node)) == (number, meta["keys"]), node
        t = meta["table"]
        expired[node] = t["expired"]
        assert meta["keys"] == t["admitted"] - t["expired"], (node, t)
        # the counts go on from the checkpoint's: every row held admitted once
        end = s["tables"]["shards"][node]
        assert end["admitted"] >= t["admitted"] and end["expired"] >= t["expired"], (node, end)
        assert end["rows"] == end["admitted"] - end["expired"] == s["shards"][node]["keys"]
    # the cut had dropped keys on some shard (with_drops), so some shard had expired keys;
    # a shard holding only frequent keys may have expired none yet
    assert sum(expired.values()) > 0, expired
    # served from disk (zbus-serve --max-rows), the chains' drops applied: every key's row
    # as the checkpoint read into memory has it, a dropped key none
    at = checkpoint_dir(c.run_dir, number)
    memory, disk = ExportedModel(at), ExportedModel(at, max_rows=1)
    assert disk.store is not None and disk.held == len(memory.keys)
    dropped = set().union(*(dropped_after_full(c.run_dir, f) for f in chains.values()))
    gone = np.array(sorted(dropped - set(memory.keys.tolist())), np.int64)
    assert len(gone), "no key dropped for good by the chains"
    found, rows = disk.find(np.concatenate([memory.keys, gone]))
    assert found.tolist() == [True] * len(memory.keys) + [False] * len(gone)
    assert np.array_equal(rows[:len(memory.keys)], memory.rows)
    every_row_once(s, ADULT_TRAIN_ROWS, 4)
    assert s["auc"] >= 0.88, s["auc"]
    assert s["duplicates_refused"]["embedding_updates"] == 0
    # the newest checkpoint serves, unknown keys on their field's default row
    assert checkpoint_auc(c.run_dir) >= 0.88
    model = ExportedModel(c.run_dir / "checkpoints")
    assert model.defaults is not None and model.defaults.shape == (2, 8, 16)
    newest = latest_complete(c.run_dir)
    assert newest is not None
    got = read_chain(checkpoints_dir(c.run_dir), newest[2]["parts"]["ps-0"])
    assert np.array_equal(model.defaults[0], got.default_weights)


@pytest.mark.parametrize("optimizer", ["adagrad", "rowwise_adagrad"])
def test_a_killed_shard_restarts_from_its_chain_with_expiry_on(cluster, optimizer):
    """Also with row-wise Adagrad: the chain holds one Adagrad sum a row, which the restarted
    shard takes back (a table of the other kind refuses it)."""
    c = cluster(ADULT_JOB, train__epochs=2, checkpoint__every_s=0.5,
                cluster__node_timeout_s=1.5, train__embedding_optimizer=optimizer, **BOUNDED)
    c.start_all(slowdown={0: 10.0, 1: 10.0})
    c.wait_for_event(lambda e: e["event"] == "checkpoint" and e["status"] == "complete"
                     and e["number"] >= 2)
    c.procs["ps-1"].send_signal(signal.SIGKILL)
    c.procs["ps-1"].wait()
    c.wait_for_event(lambda e: e["event"] == "shard_lost" and e["node"] == "ps-1", timeout=30)
    c.start_role("ps", 1, name="ps-1-again")
    assert c.wait() == 0, c.logs()
    s = c.summary()
    (r,) = s["shard_recoveries"]
    assert r["shard"] == "ps-1" and r["restored"], r
    number, keys = restored_number(c.log("ps-1-again"))
    files = chain_of(c.run_dir, number, "ps-1")
    got = read_chain(checkpoints_dir(c.run_dir), files)
    assert keys == len(got.keys) == last_meta(c.run_dir, files)["keys"]
    assert got.default_weights.shape == (8, 16) and np.abs(got.default_weights).sum() > 0
    width = 1 if optimizer == "rowwise_adagrad" else 16
    assert got.accum.shape == (len(got.keys), width) and (got.accum > 0).any()
    assert got.default_accum is not None and got.default_accum.shape == (8, width)
    assert s["samples_trained"] == 2 * ADULT_TRAIN_ROWS and s["auc"] >= 0.88, s["auc"]
    end = s["tables"]["shards"]["ps-1"]
    assert end["rows"] == s["shards"]["ps-1"]["keys"] == end["admitted"] - end["expired"]
