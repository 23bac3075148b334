#!/usr/bin/env python
"""Benchmark: a new file's first batch, in one process, as the feeder makes it with no cache:
the index, the parts and the eval split, the statistics (every training part's sample), then
one training part's stream to its first batch of 1,024. Prints seconds per step as JSON, one
line per run (a fresh, empty cache directory each run).

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_first_batch.py /tmp/criteo-10m.tsv [--repeat 3]

Run it with ``PYTHONPATH`` set to another tree to time that tree's code on the same file."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from roles.testbed.jobs import criteo_data, job_text  # noqa: E402


def first_batch(job_path: Path) -> dict:
    from roles.algorithms.feeding.passes import FeedingPass
    from roles.data.source import DataSource
    from roles.data.stream import Tally
    from roles.feeder.streams import PartStreams
    from roles.job.settings import load_job

    started = time.monotonic()
    job = load_job(job_path)
    source = DataSource(job)
    files, parts, n_train = source.index()
    source.files = files
    indexed = time.monotonic()
    preparer = source.preparer(parts)
    ready = time.monotonic()
    training = [p for p in parts if not p.eval]
    streams = PartStreams(job, source)
    stream = streams.training(training[0], 0, None, preparer, Tally(), lambda *_: None)
    FeedingPass(0, False, [stream], open=job.data.parts_open).take()
    first = time.monotonic()
    streams.close()
    return {"index_s": round(indexed - started, 2), "stats_s": round(ready - indexed, 2),
            "first_batch_s": round(first - started, 2), "n_train": n_train,
            "parts": len(parts), "bytes_read": source.bytes_read}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a Criteo-layout file (scripts/make_criteo.py)")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            job = Path(tmp) / "job.toml"
            job.write_text(job_text("first-batch", criteo_data(args.path)))
            os.environ["ZBUS_CACHE_DIR"] = str(Path(tmp) / "cache")
            print(json.dumps(first_batch(job)), flush=True)


if __name__ == "__main__":
    main()
