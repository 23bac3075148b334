"""Streamed data over real processes: a feeder under a memory budget enforced by the OS trains
a file larger than that budget, and its memory does not grow with the data it reads
(Criteo-layout files made by the generator)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pytest
from harness import REPO
from resumes import every_row_once

from roles.testbed.local_cluster import BUDGET_STACK

pytestmark = pytest.mark.integration

# part_mb pinned: by default a part is the data's size / 64 (4 to 64 MiB), and a feeder reads
# a part in chunks of up to 8 MiB, so its working set grows with the file up to 8 MiB chunks
# (190 -> 258 MB of VmData from a 290 MB to a 580 MB file); with 4 MiB parts it is flat
JOB = """name = "stream"
[data]
path = "{path}"
format = "criteo"
eval_fraction = 0.05
shuffle_buffer = 20000
part_mb = 4
[model]
embedding_dim = 4
hidden = [8]
[train]
epochs = 1
batch_size = 4096
sync_every = 16
[cluster]
workers = 1
shards = 1
"""
# The feeder's RLIMIT_DATA (LocalCluster.budgets): it needs about 200 MiB of it for this job
# on 2 cores (its imports about 90, numpy's BLAS buffer among them; 12 threads' stacks; 4 open
# parts' chunks, parsed and shuffled), whatever the file's size; it failed under 192 MiB, ran
# at 208. pyarrow parses on a thread per core, and each thread's stack is reserved address
# space that RLIMIT_DATA counts (a container's limit counts only the pages used): the budget
# adds one stack for each core beyond 2. On a 16-core machine the feeder peaked at 214 MiB of
# VmData (1 copy) and 223 MiB (10 copies), 28 MiB of it the 14 more threads' stacks.
BUDGET = (224 << 20) + BUDGET_STACK * max(0, pa.cpu_count() - 2)
ROWS = 100_000


def criteo_file(tmp_path: Path, copies: int) -> Path:
    """ROWS generated rows (scripts/make_criteo.py), the file written ``copies`` times over
    (generating is ~10 us a row; the feeder reads a copy as it reads new rows)."""
    made = tmp_path / "criteo.tsv"
    if not made.exists():
        subprocess.run([sys.executable, str(REPO / "scripts" / "make_criteo.py"), "--rows",
                        str(ROWS), "--out", str(made)], check=True, capture_output=True)
    path = tmp_path / f"criteo-x{copies}.tsv"
    with open(path, "wb") as out:
        for _ in range(copies):
            with open(made, "rb") as src:
                shutil.copyfileobj(src, out)
    return path


def feeder_under_budget(cluster, tmp_path, copies: int) -> tuple[int, int, dict]:
    """The job on ROWS x ``copies`` rows, the feeder under BUDGET: its peak RSS, the file's
    size, the summary."""
    path = criteo_file(tmp_path, copies)
    job = tmp_path / f"job-{copies}.toml"
    job.write_text(JOB.format(path=path))
    c = cluster(job)
    c.budgets["feeder-0"] = BUDGET
    c.start_all()
    feeder = psutil.Process(c.procs["feeder-0"].pid)
    assert feeder.rlimit(psutil.RLIMIT_DATA) == (BUDGET, BUDGET)  # the OS holds it to that
    peak = 0
    while c.procs["control-0"].poll() is None:
        try:
            peak = max(peak, feeder.memory_info().rss)
        except psutil.Error:
            pass
        time.sleep(0.05)
    assert c.wait() == 0, c.logs()  # a feeder over its budget fails, and the job with it
    return peak, path.stat().st_size, c.summary()


def test_a_feeders_memory_stays_flat_however_large_the_file(cluster, tmp_path):
    small, one, _ = feeder_under_budget(cluster, tmp_path, 1)
    copies = max(10, -(-BUDGET * 5 // 4 // one))   # 10 (242 MB), more where the budget is more
    large, size, s = feeder_under_budget(cluster, tmp_path, copies)
    assert s["ok"] and s["rows_read"] == copies * ROWS
    every_row_once(s, s["samples_in_data"], 1)   # the split is by bytes: about 95% of rows
    assert abs(s["samples_in_data"] - copies * ROWS * 0.95) < copies * ROWS * 0.001
    assert s["parts"]["parts"] > 10  # read part by part, a few at a time
    assert size > BUDGET, (size >> 20, BUDGET >> 20)  # the file does not fit the budget
    # ten or more times the rows (the file grows by 220 MB or more): the feeder's memory does
    # not follow
    assert large - small < 40 << 20, (small >> 20, large >> 20, size >> 20)
