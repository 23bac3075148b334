#!/usr/bin/env python
"""Benchmark: streaming ingest on Criteo-layout files (label, I1..I13, C1..C26; made by
``scripts/make_criteo.py``, not committed), all figures from one run; measurements 1 and 2
are each made ``--repeat`` times, interleaved, and their medians quoted.

1. **Bare read**: pyarrow's streaming CSV reader over the whole file, as a user would read it
   (``pyarrow.csv.open_csv``, default options: types inferred, threads on), and the same with the
   column types given, on one thread (the feeder's settings): rows/s.
2. **One feeder's ingest**: the feeder's pipeline alone, in its own process (index, statistics,
   every training part read, parsed, hashed, transformed, weighted and cut into batches of 1,024
   through the shuffle buffer, as the feeder does it: ``parts_open`` parts at a time, each
   part's next block read ahead on the reader thread): rows/s, its peak RSS, and the ratio to the
   bare read. Both hash functions are timed on the same chunks (the vectorised key hash zbus uses,
   and blake2b of each distinct value, as zbus did before).
3. **Two feeders**: two such processes at once, each reading its half of the parts (as control
   assigns them): bytes each read, and their combined rows/s against one feeder's.
4. **A job** (``--job-rows``; 2 workers, 2 shards, 1 epoch, embedding dim 8, MLP 64-32): the
   time from the feeder's start to its first acknowledged batch, every role's peak RSS,
   samples/s, AUC; and ``zbus-reference`` on the same file. Up to 2M rows, the same job again
   with the whole training split in one shuffle buffer (one part): the AUC the streaming order
   costs.
5. **From S3** (``--s3``, in place of 1 to 4): the file uploaded to a local S3 server (moto's
   server mode, ``roles/testbed/s3.py``), and one feeder's ingest (2) of the object against the same
   file on the local disk, interleaved, ``--repeat`` times each: rows/s of both and their
   ratio, and the time to index the object with no cache (once). moto serves from the same
   machine's CPUs, so the figure is a floor for a store elsewhere on a fast network.

    .venv/bin/python scripts/bench_ingest.py --rows 1000000 10000000 [--job-rows 1000000]
    .venv/bin/python scripts/bench_ingest.py --rows 1000000 --s3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable

from roles.testbed.jobs import criteo_data, job_text  # noqa: E402

PIPELINE = r"""
import json, resource, sys, time
from roles.algorithms.feeding.passes import FeedingPass
from roles.feeder.streams import PartStreams
from roles.data.source import DataSource
from roles.data.stream import Tally
from roles.job.settings import load_job
job = load_job(sys.argv[1])
share, of = int(sys.argv[2]), int(sys.argv[3])
started = time.monotonic()
source = DataSource(job)
files, parts, _ = source.index()
source.files = files
indexed = time.monotonic() - started
prepare = source.preparer(parts)
ready = time.monotonic() - started
training = [p for p in parts if not p.eval]
mine = [p for i, p in enumerate(training) if i * of // len(training) == share]
streams = PartStreams(job, source)   # as the feeder streams them: parts_open at a time
tally, batches, t0 = Tally(), 0, time.monotonic()
before = resource.getrusage(resource.RUSAGE_SELF)
pass_ = FeedingPass(0, False, [streams.training(p, 0, None, prepare, tally, lambda *_: None)
                               for p in mine], open=job.data.parts_open)
first = None
while pass_.take() is not None:
    batches += 1
    first = first or time.monotonic() - started
seconds = time.monotonic() - t0
used = resource.getrusage(resource.RUSAGE_SELF)
streams.close()
print(json.dumps({"rows": tally.rows_read, "samples": tally.samples, "batches": batches,
                  "seconds": seconds, "rows_per_s": tally.rows_read / seconds,
                  "index_s": indexed, "stats_s": ready - indexed, "first_batch_s": first,
                  "bytes_read": source.bytes_read,
                  "cpu_s": used.ru_utime + used.ru_stime - before.ru_utime - before.ru_stime,
                  "peak_rss_mb": used.ru_maxrss / 1024}))
"""

HASHES = r"""
import json, sys, time
from hashlib import blake2b
import numpy as np
import pyarrow.compute as pc
from roles.data.hashing import hash_array
from roles.data.index import index_files, plan_parts
from roles.data.readers import Schema, read_part
files = index_files([sys.argv[1]], "criteo")
parts, _ = plan_parts(files, 0.2, 64)
schema = Schema(label="label", dense=[f"I{i}" for i in range(1, 14)],
                sparse=[f"C{i}" for i in range(1, 27)])
blocks = []
for b in read_part(files, parts[0], "criteo", schema):
    blocks.append(b)
    if sum(len(x) for x in blocks) >= 200_000:
        break
rows = sum(len(b) for b in blocks)

def blake(field, column):
    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    enc = column if column.type.id == 29 else pc.dictionary_encode(column)
    values = enc.dictionary.to_pylist()
    keys = np.fromiter((int.from_bytes(blake2b(f"{field}\x1f{v}".encode(), digest_size=8)
                        .digest(), "little", signed=True) for v in values), np.int64,
                       count=len(values))
    return keys[enc.indices.fill_null(0).to_numpy(zero_copy_only=False)]

out = {}
for name, fn in (("vectorised", hash_array), ("blake2b of distinct values", blake)):
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for b in blocks:
            for f, column in enumerate(b.sparse):
                fn(f"C{f + 1}", column)
        best = min(best, time.perf_counter() - t)
    out[name] = rows / best
print(json.dumps(out))
"""

BARE = r"""
import json, sys, time
import pyarrow as pa, pyarrow.csv as csv
from roles.data.index import CRITEO_COLUMNS
path, typed = sys.argv[1], sys.argv[2] == "typed"
types = None
if typed:
    types = {"label": pa.float64(), **{f"I{i}": pa.float64() for i in range(1, 14)},
             **{f"C{i}": pa.dictionary(pa.int32(), pa.string()) for i in range(1, 27)}}
t = time.monotonic()
reader = csv.open_csv(path, read_options=csv.ReadOptions(column_names=CRITEO_COLUMNS,
                                                         use_threads=not typed),
                      parse_options=csv.ParseOptions(delimiter="\t", quote_char=False),
                      convert_options=csv.ConvertOptions(column_types=types))
rows = sum(b.num_rows for b in reader)
print(json.dumps({"rows": rows, "rows_per_s": rows / (time.monotonic() - t)}))
"""

SYNC = 'sync = "every"\nsync_every = 16'

# streamed, in a process of its own: the bench's own memory stays small, since each measured
# process is forked from it (and a fork's peak RSS counts its parent's pages until exec)
UPLOAD = r"""
import sys, pyarrow.fs as pafs
from roles.storage.fs import filesystem
fs, key = filesystem(sys.argv[2])
pafs.copy_files(sys.argv[1], key, destination_filesystem=fs)
"""


def run(code: str, *args: str, env: dict | None = None) -> dict:
    out = subprocess.run([PY, "-c", code, *args], capture_output=True, text=True, check=True,
                         cwd=REPO, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def make_file(rows: int, where: Path) -> Path:
    path = where / f"criteo-{rows}.tsv"
    if not path.exists():
        subprocess.run([PY, str(REPO / "scripts" / "make_criteo.py"), "--rows", str(rows),
                        "--out", str(path)], check=True, cwd=REPO)
    return path


def median_of(runs: list[dict]) -> dict:
    """The run of median rows/s (its other figures with it)."""
    return sorted(runs, key=lambda r: r["rows_per_s"])[len(runs) // 2]


def ingest(path: Path, work: Path, repeat: int) -> dict:
    job = work / f"job-{path.stem}.toml"
    job.write_text(job_text("criteo-bench", criteo_data(path), train=SYNC))
    env = {**os.environ, "ZBUS_CACHE_DIR": str(work / "cache")}
    run(PIPELINE, str(job), "0", "1", env=env)       # makes the caches (index, statistics)
    bare, typed, ones = [], [], []
    for _ in range(repeat):  # interleaved, so that the machine's noise falls on all three
        bare.append(run(BARE, str(path), "default"))
        typed.append(run(BARE, str(path), "typed"))
        ones.append(run(PIPELINE, str(job), "0", "1", env=env))  # as a second run sees it
    b, t, one = median_of(bare), median_of(typed), median_of(ones)
    two = [subprocess.Popen([PY, "-c", PIPELINE, str(job), str(i), "2"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, text=True) for i in range(2)]
    halves = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in two]
    combined = sum(h["rows"] for h in halves) / max(h["seconds"] for h in halves)
    hashes = run(HASHES, str(path))
    return {"rows": b["rows"], "file_mb": round(path.stat().st_size / 2**20), "repeat": repeat,
            "bare_default": round(b["rows_per_s"]), "bare_typed": round(t["rows_per_s"]),
            "feeder": {k: round(v, 2) if isinstance(v, float) else v for k, v in one.items()},
            "feeder_rows_per_s_each": sorted(round(r["rows_per_s"]) for r in ones),
            "ratio_to_bare_default": round(one["rows_per_s"] / b["rows_per_s"], 2),
            "ratio_to_bare_typed": round(one["rows_per_s"] / t["rows_per_s"], 2),
            "two_feeders": {"bytes_read": [h["bytes_read"] for h in halves],
                            "peak_rss_mb": [round(h["peak_rss_mb"]) for h in halves],
                            "rows_per_s": round(combined),
                            "speedup": round(combined / one["rows_per_s"], 2),
                            # one feeder already keeps this many cores busy: the bound on
                            # the speedup of two on this machine is cores / this
                            "cores": os.cpu_count(),
                            "one_feeder_cores_busy": round(one["cpu_s"] / one["seconds"], 2),
                            "cpu_s_per_m_rows": {
                                "one": round(one["cpu_s"] / one["rows"] * 1e6, 2),
                                "two": round(sum(h["cpu_s"] for h in halves)
                                             / sum(h["rows"] for h in halves) * 1e6, 2)}},
            "hash_rows_per_s": {k: round(v) for k, v in hashes.items()}}


def s3_ingest(path: Path, work: Path, repeat: int) -> dict:
    """One feeder's ingest of ``path`` from a local S3 server against the local disk."""
    from roles.testbed.s3 import S3Server

    with S3Server() as server:
        uri = server.uri(f"bench/{path.name}")
        env = {**os.environ, **server.env, "ZBUS_CACHE_DIR": str(work / "cache-s3")}
        subprocess.run([PY, "-c", UPLOAD, str(path), uri], check=True, cwd=REPO, env=env)
        jobs = {}
        for where, data in (("local", str(path)), ("s3", uri)):
            jobs[where] = work / f"job-{where}-{path.stem}.toml"
            jobs[where].write_text(job_text("criteo-bench", criteo_data(data), train=SYNC))
        shutil.rmtree(work / "cache-s3", ignore_errors=True)
        cold = run(PIPELINE, str(jobs["s3"]), "0", "1", env=env)   # indexes the object
        run(PIPELINE, str(jobs["local"]), "0", "1", env=env)
        runs: dict[str, list[dict]] = {"local": [], "s3": []}
        for _ in range(repeat):
            for where in ("local", "s3"):
                runs[where].append(run(PIPELINE, str(jobs[where]), "0", "1", env=env))
    local, s3 = median_of(runs["local"]), median_of(runs["s3"])
    return {"rows": local["rows"], "file_mb": round(path.stat().st_size / 2**20),
            "repeat": repeat,
            "local_rows_per_s": round(local["rows_per_s"]),
            "s3_rows_per_s": round(s3["rows_per_s"]),
            "s3_to_local": round(s3["rows_per_s"] / local["rows_per_s"], 2),
            "local_rows_per_s_each": sorted(round(r["rows_per_s"]) for r in runs["local"]),
            "s3_rows_per_s_each": sorted(round(r["rows_per_s"]) for r in runs["s3"]),
            "s3_bytes_read": s3["bytes_read"], "s3_peak_rss_mb": round(s3["peak_rss_mb"]),
            "local_peak_rss_mb": round(local["peak_rss_mb"]),
            "s3_index_s_no_cache": round(cold["index_s"], 2),
            "s3_first_batch_s_no_cache": round(cold["first_batch_s"], 2)}


def job_run(path: Path, work: Path, **settings: object) -> dict:
    import psutil

    from roles.testbed.local_cluster import LocalCluster

    shutil.rmtree(work, ignore_errors=True)  # a run directory of its own, never resumed
    work.mkdir(parents=True)
    job = work / "job-run.toml"
    job.write_text(job_text("criteo-bench", criteo_data(path), train=SYNC))
    peak: dict[str, int] = {}
    with LocalCluster(work / "cluster", job, transport="tcp", **settings) as c:
        started = time.monotonic()
        c.start_all()
        while c.procs["control-0"].poll() is None and time.monotonic() - started < 3000:
            for name, proc in c.procs.items():
                try:
                    rss = psutil.Process(proc.pid).memory_info().rss
                except psutil.Error:
                    continue
                peak[name] = max(peak.get(name, 0), rss)
            time.sleep(0.2)
        if c.wait(timeout=60) != 0:
            raise SystemExit(f"the job failed:\n{c.logs()}")
        s = c.summary()
        first = next((line for line in c.log("feeder-0").splitlines()
                      if "first batch acknowledged" in line), "")
    env = {**os.environ, "ZBUS_CACHE_DIR": str(work / "cache")}
    ref = subprocess.run([PY, "-m", "roles.tools.reference", "--job", str(job)],
                         capture_output=True, text=True, check=True, cwd=REPO, env=env)
    reference = json.loads(ref.stdout)
    return {"samples_per_s": s["samples_per_s"], "auc": s["auc"],
            "reference_samples_per_s": round(reference["samples_per_s"]),
            "reference_auc": reference["auc"],
            "ratio_to_reference": round(s["samples_per_s"] / reference["samples_per_s"], 2),
            "first_batch": first.split(": ", 2)[-1],
            "peak_rss_mb": {k: round(v / 2**20) for k, v in sorted(peak.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--job-rows", type=int, nargs="*", default=[1_000_000])
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each ingest measurement; the median is quoted")
    parser.add_argument("--dir", help="where the generated files are kept (default: a "
                                      "temporary directory)")
    parser.add_argument("--s3", action="store_true",
                        help="only one feeder's ingest from a local S3 server (moto) against "
                             "the local disk, on each --rows file")
    args = parser.parse_args()
    keep = Path(args.dir) if args.dir else None
    with tempfile.TemporaryDirectory() as tmp:
        work = keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.s3:
            for rows in args.rows:
                measured = s3_ingest(make_file(rows, work), work, args.repeat)
                print(json.dumps({"s3_ingest": measured}), flush=True)
            return
        for rows in args.rows:
            measured = ingest(make_file(rows, work), work, args.repeat)
            print(json.dumps({"ingest": measured}), flush=True)
        for rows in args.job_rows:
            path = make_file(rows, work)
            streamed = job_run(path, work / f"job-{rows}")
            print(json.dumps({"job": {"rows": rows, **streamed}}), flush=True)
            if rows <= 2_000_000:  # the same job shuffled whole in one buffer: the buffer's cost
                whole = job_run(path, work / f"job-{rows}-whole", data__shuffle_buffer=rows,
                                data__parts_open=1, data__part_mb=1 << 20)
                print(json.dumps({"job_fully_shuffled": {
                    "rows": rows, "auc": whole["auc"], "peak_rss_mb": whole["peak_rss_mb"],
                    "auc_streamed_minus_whole": round(streamed["auc"] - whole["auc"], 4)}}),
                      flush=True)


if __name__ == "__main__":
    main()
