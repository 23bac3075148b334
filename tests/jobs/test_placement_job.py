"""Skew-aware placement in a real job: Zipf-skewed keys, two shards, one slowed 2x."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from harness import REPO

from roles.algorithms.control.capacity import OPERATIONS, Record, filter_outliers, read_records
from roles.checkpoint.model_files import embeddings_file, load_embeddings

ZIPF_JOB = REPO / "jobs" / "zipf.toml"   # mode skew, windows of 10 batches
SLOW_SHARD = {1: 2.0}
# the job file's 4 left a busy machine one window or none after the first migration, and 8 did
# once workers stepped faster (the sample-major grid): the predictor's child takes as many
# seconds as before, so its first placement comes more windows into the job
EPOCHS = 12


def seconds_per_pair(records: list[Record], shard: int) -> float:
    """What the capacity predictor learns a shard's speed from: its seconds per pair, lookup
    and update together, each the geometric mean over the windows left by the outlier filter
    (the predictor fits log seconds per pair)."""
    kept, _ = filter_outliers(records)
    return sum(float(np.exp(np.mean([r.log_seconds_per_pair for r in kept
                                      if r.op == op and r.shard == shard])))
               for op in OPERATIONS)


def exported_rows(s: dict) -> dict[int, np.ndarray]:
    rows: dict[int, np.ndarray] = {}
    for shard in range(2):
        keys, values = load_embeddings(Path(s["export"]) / embeddings_file(shard))
        assert not set(rows) & set(keys.tolist()), "a key exported by two shards"
        rows.update(zip(keys.tolist(), values, strict=True))
    return rows


# The skewed job's roles are processes: the capacities are learnt from each shard's CPU time per
# pair, its own machine's only when the shard has its thread (and caches) to itself. In one
# process every role's work takes turns on one thread, and the slowed shard, which works in
# bursts after each rest, measured 1.70-1.81x the other's seconds per pair (2.2-3.0x as a
# process, the bar below 1.8). The hashed job, which only gives the rows and the quality to
# compare with, runs in this process.
@pytest.mark.integration
def test_the_slow_shard_gets_the_load_its_measured_speed_takes_and_nothing_is_lost(
        cluster):
    job = ZIPF_JOB
    hashed = cluster(job, in_process=True, placement__mode="hash", train__epochs=EPOCHS)
    assert hashed.run_job(ps_slowdown=SLOW_SHARD) == 0, hashed.logs()
    skewed = cluster(job, placement__mode="skew", train__epochs=EPOCHS)
    assert skewed.run_job(ps_slowdown=SLOW_SHARD) == 0, skewed.logs()
    h, s = hashed.summary(), skewed.summary()
    p = s["placement"]
    brief = {k: v for k, v in p.items() if k != "windows"}

    # the capacities were learnt from the job's own history, and keys moved (control's log
    # says why not: the predictor's trainings and placement's decisions)
    said = "\n".join(line for line in skewed.log("control-0").splitlines()
                     if "placement" in line or "capacity" in line or "WARNING" in line)
    assert p["migrations"] >= 1 and p["moved_keys"] > 0, (brief, said[-4000:])
    assert p["pause_s_total"] > 0, brief
    moved_out = sum(x["keys_moved_out"] for x in s["shards"].values())
    assert moved_out == sum(x["keys_moved_in"] for x in s["shards"].values()) == p["moved_keys"]
    placement_dir = skewed.run_dir / "placement"
    assert (placement_dir / "capacity_model.pt").exists()
    records = read_records(placement_dir)
    assert len((placement_dir / "capacity_records.jsonl").read_text().splitlines()) \
        == len(records) == p["records"]
    learnt = [w for w in p["windows"] if w["capacity_source"] == "predicted"]
    assert learnt, brief
    # trained in a child process of control's, not in control's loop
    assert p["predictor_fits"] >= 1 and p["predictor_pid"] not in (0, skewed.procs[
        "control-0"].pid), brief
    # the windows counted under a placement made from learnt capacities (version 1 on): the
    # first migration waits for the predictor, trained in a child process, so it comes later on
    # a busy machine; 8 epochs leave room for several windows after it
    placed = [w for w in p["windows"] if w["version"] >= 1]
    assert len(placed) >= 4, [(w["window"], w["version"], w["decision"]) for w in p["windows"]]
    late = placed[-8:]
    caps = late[-1]["capacity"]
    # The learnt capacities are the shards' measured speeds: shard 1's time is its thread's CPU
    # time x 2 (--slowdown 2), so the ratio is 2 x what its keys cost per pair against shard
    # 0's. Before any key moved (the windows of version 0, hashed keys) that was 0.98-1.19 at
    # 1x (shard 0 holds more of the heaviest Zipf keys, which cost least per pair): the ratio
    # 1.96-2.38 on AMD EPYC, 1.77-2.20 on an Intel Xeon (4 runs, 2026-12-01). It rises once
    # placement hands the slow shard fewer pairs per key, by how much the host's caches say:
    # up to 1.3x on AMD EPYC (2.28-3.04 over the whole job in 22 runs, 3.04 beside 3 busy
    # loops), 1.36-1.57x on the Intel Xeon (2.90-3.93 over the whole job; a bar of 3.2 set on
    # AMD failed there in 3 of 5 runs). So the rise is checked against the same run's windows
    # where both shards held hashed keys.
    version = {e["window"]: e["version"] for e in skewed.events()
               if e["event"] == "placement_window"}
    before = [r for r in records if version.get(r.window) == 0]
    hashed_ratio = seconds_per_pair(before, 1) / seconds_per_pair(before, 0)
    assert hashed_ratio <= 2.6, (hashed_ratio, len(before))
    measured = seconds_per_pair(records, 1) / seconds_per_pair(records, 0)
    assert 1.8 <= measured <= hashed_ratio * 1.8, (measured, hashed_ratio, late[-1])
    # ... and the predictor learnt them (0.985-1.019 of the measured ratio in 23 runs)
    assert 0.9 <= caps[0] / caps[1] / measured <= 1.1, (caps, measured)
    # under the learnt placement the slow shard is assigned less than half the fast one's load
    # (hash placement gives both the same keys), in proportion to the capacities give or take
    # what a window's keys happen to be (a window's ratio moves by 0.2 or more from one to the
    # next)
    ratio = np.median([w["assigned"][1] / w["assigned"][0] for w in late])
    assert ratio <= 0.7 and 0.65 <= ratio / (caps[1] / caps[0]) <= 1.35, (ratio, late)

    # the same rows as without migration: same keys, every value finite; quality unchanged
    rows_h, rows_s = exported_rows(h), exported_rows(s)
    assert set(rows_h) == set(rows_s)
    assert all(np.isfinite(v).all() for v in rows_s.values())
    assert abs(s["auc"] - h["auc"]) <= 0.005, (s["auc"], h["auc"])
    assert s["samples_trained"] == h["samples_trained"]


@pytest.mark.inprocess
def test_every_window_of_every_shard_is_recorded_once_when_windows_close_faster_than_heartbeats(
        cluster):
    """Windows of 2 batches close several times per heartbeat (0.25 s here): every shard's work
    in every closed window is a history record, once."""
    c = cluster(ZIPF_JOB, train__epochs=2, placement__window_batches=2)
    assert c.run_job() == 0, c.logs()
    closed = [e for e in c.events() if e["event"] == "placement_window"]
    gaps = np.diff([e["t"] for e in closed])
    assert np.median(gaps) < c.job.cluster.heartbeat_s / 2, gaps   # > 2 per heartbeat
    recorded = Counter((r.window, r.shard, r.op) for r in read_records(c.run_dir / "placement"))
    assert set(recorded.values()) == {1}, recorded.most_common(3)   # none twice
    windows = {e["window"] for e in closed}
    missing = {(w, shard) for w in windows for shard in (0, 1)
               if (w, shard, "lookup") not in recorded or (w, shard, "update") not in recorded}
    # the windows of the job's last heartbeats may go unrecorded: the shards leave at once when
    # the job is over, and no placement decision is left for those records to serve
    end = max(e["t"] for e in closed) - 2 * c.job.cluster.heartbeat_s
    last = {e["window"] for e in closed if e["t"] >= end}
    assert {w for w, _ in missing} <= last, (sorted(missing), len(windows))
    p = c.summary()["placement"]
    assert p["records"] == len(recorded) and p["records_unrecordable"] == 0
