"""Streamed data over real processes: a feeder's memory does not grow with the data it reads
(Criteo-layout files made by the generator, larger than the feeder's memory)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest
from harness import REPO

pytestmark = pytest.mark.integration

JOB = """name = "stream"
[data]
path = "{path}"
format = "criteo"
eval_fraction = 0.05
shuffle_buffer = 20000
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


def feeder_peak_rss(cluster, tmp_path, rows: int) -> tuple[int, int, dict]:
    path = tmp_path / f"criteo-{rows}.tsv"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_criteo.py"), "--rows",
                    str(rows), "--out", str(path)], check=True, capture_output=True)
    job = tmp_path / f"job-{rows}.toml"
    job.write_text(JOB.format(path=path))
    c = cluster(job)
    c.start_all()
    peak = 0
    while c.procs["control-0"].poll() is None:
        try:
            peak = max(peak, psutil.Process(c.procs["feeder-0"].pid).memory_info().rss)
        except psutil.Error:
            pass
        time.sleep(0.05)
    assert c.wait() == 0, c.logs()
    return peak, path.stat().st_size, c.summary()


def test_a_feeders_memory_stays_flat_however_large_the_file(cluster, tmp_path):
    small, _, _ = feeder_peak_rss(cluster, tmp_path, 100_000)
    large, size, s = feeder_peak_rss(cluster, tmp_path, 600_000)
    assert s["ok"] and s["rows_read"] == 600_000 and s["samples_trained"] == 570_000
    assert s["parts"]["parts"] > 10  # read part by part, a few at a time
    # six times the rows (the file grows by ~125 MB): the feeder's memory does not follow
    assert large - small < 40 << 20, (small >> 20, large >> 20, size >> 20)
