#!/usr/bin/env python
"""Benchmark: embedding tables that stay bounded (``[embeddings]``: admission, expiry,
eviction), all figures from one run.

1. **Parts** (pure code, in this process): the key index's cost of deletion (inserts, look-ups
   and deletes per key with tombstones and rebuilds, against inserts into an index that only
   grows); the count-min sketch's false admissions (keys seen once each that it says were seen
   ``min_count`` times, by ``sketch_mb``) and its cost per sighting; one expiry sweep piece and
   one eviction on a table of ``--sweep-keys`` keys (the longest pause they put in a shard's
   loop).
2. **Jobs** (``LocalCluster``, real processes over TCP loopback; 2 workers, 2 shards, 1 epoch,
   embedding dim 16, MLP 64-32, batches of 1,024): the built-in Zipf data (``jobs/zipf.toml``'s
   generator, 8 fields, with its two largest vocabularies made 100× larger so that it has a
   long tail) and Criteo-layout files made by ``scripts/make_criteo.py`` (``--criteo-rows``,
   generated into ``--dir`` or a temporary directory, never committed), each trained without
   bounds and with ``min_count = 3`` and ``expire_batches`` (``--expire``); each pair
   ``--repeat`` times, interleaved. Per job: keys held per shard at the end and at most (the
   ``tables`` events of metrics.jsonl), each shard's peak RSS (psutil, every 0.2 s), AUC,
   samples/s, and the counts (admitted, rejected for now, expired).

    .venv/bin/python scripts/bench_admission.py [--criteo-rows 1000000 3000000]
        [--zipf-rows 2000000] [--repeat 1] [--dir DIR] [--parts-only | --jobs-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

from roles.algorithms.shard.admission import CountMinSketch, sketch_width  # noqa: E402
from roles.algorithms.shard.embedding_table import EmbeddingTable  # noqa: E402
from roles.algorithms.shard.expiry import Expiry  # noqa: E402
from roles.algorithms.shard.key_index import KeyIndex  # noqa: E402
from roles.testbed.jobs import criteo_data, job_text  # noqa: E402

PY = sys.executable
ZIPF_VOCAB = [5, 20, 200, 2000, 2_000_000, 50, 1000, 500_000]   # zipf.toml's, tail x100


def admission_job(data: str) -> str:
    return job_text("bench-admission", data, dim=16, train='sync = "every"\nsync_every = 16')


ZIPF_DATA = """source = "synthetic"
[data.synthetic]
rows = {rows}
vocab = {vocab}
dense = 4
zipf = 1.2
seed = 3"""


def timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


# -- part 1: the pure parts ----------------------------------------------------------------------
def index_costs(n: int = 1_000_000, churn: int = 10_000, rounds: int = 100) -> dict:
    """ns per key: growing an index to n keys; then rounds of churn (insert `churn` new keys,
    delete `churn` old ones, look up a batch), as expiry makes it."""
    rng = np.random.default_rng(1)
    keys = rng.integers(-2**63, 2**63 - 1, n + churn * rounds, dtype=np.int64)
    index = KeyIndex(1024)
    t = time.perf_counter()
    for at in range(0, n, churn):
        index.insert(keys[at:at + churn], np.arange(at, at + churn))
    grow = (time.perf_counter() - t) / n
    before = index.rebuilds
    ins = dele = look = 0.0
    for r in range(rounds):
        new = keys[n + r * churn:n + (r + 1) * churn]
        old = keys[r * churn:(r + 1) * churn]
        t0 = time.perf_counter()
        index.insert(new, np.arange(len(new)))
        t1 = time.perf_counter()
        index.delete(old)
        t2 = time.perf_counter()
        index.find(keys[n + r * churn - churn // 2:n + r * churn + churn // 2])
        t3 = time.perf_counter()
        ins, dele, look = ins + t1 - t0, dele + t2 - t1, look + t3 - t2
    per = churn * rounds
    return {"keys": n, "grow_ns_per_key": round(grow * 1e9), "churn_keys": per,
            "insert_ns_per_key": round(ins / per * 1e9), "delete_ns_per_key":
            round(dele / per * 1e9), "find_ns_per_key": round(look / per * 1e9),
            "rebuilds_during_churn": index.rebuilds - before,
            "tombstones_at_end": index.tombstones, "slots": index.capacity}


def sketch_costs(distinct: int = 4_000_000, batch: int = 13_000) -> list[dict]:
    """Keys seen once each (the long tail) added in batches of distinct keys as shards add
    them; the fraction the sketch then says were seen >= 2 and >= 3 times."""
    keys = np.random.default_rng(2).integers(-2**63, 2**63 - 1, distinct, dtype=np.int64)
    ones = np.ones(batch, dtype=np.int64)
    out = []
    for mb in (1, 4, 16):
        sketch = CountMinSketch(sketch_width(mb))
        t = time.perf_counter()
        for at in range(0, distinct, batch):
            chunk = keys[at:at + batch]
            sketch.estimate(chunk)
            sketch.add(chunk, ones[:len(chunk)])
        seconds = time.perf_counter() - t
        recent = keys[-sketch.width // 2:]        # seen since about the last halving
        est = sketch.estimate(recent)
        out.append({"sketch_mb": mb, "width": sketch.width, "halvings": sketch.halvings,
                    "ns_per_sighting": round(seconds / distinct * 1e9),
                    "once_seen_as_2": round(float((est >= 2).mean()), 5),
                    "once_seen_as_3": round(float((est >= 3).mean()), 5)})
    return out


def sweep_costs(n: int) -> dict:
    """The longest pause expiry and eviction put in a shard's loop (one piece of a pass), and
    a whole pass, on a table of n keys (dim 1: the cost is the last-seen clocks' and the
    index's, not the rows')."""
    table = EmbeddingTable(1, 0.01, 0.05, capacity=n)
    keys = np.arange(1, n + 1, dtype=np.int64) * 7919
    for at in range(0, n, 100_000):
        table.clock += 1
        table.rows_for(keys[at:at + 100_000])

    def passes(exp: Expiry) -> list[float]:
        pieces = []
        while True:
            t = time.perf_counter()
            exp.tick(table, 0.0, list)
            pieces.append(time.perf_counter() - t)
            if exp.cursor < 0 and exp.sweeps:
                return pieces

    expire = passes(Expiry(expire_batches=table.clock // 2, expire_s=0, max_rows=0, now=0.0))
    expired = n - len(table)
    for at in range(0, n, 100_000):   # the keys back, newer than the rest
        table.clock += 1
        table.rows_for(keys[at:at + 100_000])
    cap = Expiry(0, 0, max_rows=n - n // 8, now=0.0)
    evict = passes(cap)
    return {"keys": n, "pieces": len(expire), "expiry_piece_ms_max":
            round(max(expire) * 1e3, 1), "expiry_piece_ms_median":
            round(statistics.median(expire) * 1e3, 1), "expiry_pass_ms":
            round(sum(expire) * 1e3, 1), "expired": expired, "eviction_piece_ms_max":
            round(max(evict) * 1e3, 1), "eviction_piece_ms_median":
            round(statistics.median(evict) * 1e3, 1),
            "eviction_pass_ms": round(sum(evict) * 1e3, 1), "evicted": cap.evicted,
            "keys_after_eviction": len(table), "cap": cap.cap}


# -- part 2: jobs --------------------------------------------------------------------------------
def make_criteo(rows: int, where: Path) -> Path:
    path = where / f"criteo-{rows}.tsv"
    if not path.exists():
        subprocess.run([PY, str(REPO / "scripts" / "make_criteo.py"), "--rows", str(rows),
                        "--out", str(path)], check=True, cwd=REPO)
    return path


def job_run(job_text: str, work: Path, **settings: object) -> dict:
    import shutil

    import psutil

    from roles.testbed.local_cluster import LocalCluster

    shutil.rmtree(work, ignore_errors=True)  # a run directory of its own, never resumed
    work.mkdir(parents=True)
    job = work / "job.toml"
    job.write_text(job_text)
    peak: dict[str, int] = {}
    trace: list[float] = []   # the shards' mean RSS, the most so far, every 0.2 s
    with LocalCluster(work / "cluster", job, transport="tcp", **settings) as c:
        started = time.monotonic()
        c.start_all()
        while c.procs["control-0"].poll() is None and time.monotonic() - started < 3000:
            now = []
            for name, proc in c.procs.items():
                if name.startswith("ps-"):
                    try:
                        rss = psutil.Process(proc.pid).memory_info().rss
                    except psutil.Error:
                        continue
                    peak[name] = max(peak.get(name, 0), rss)
                    now.append(rss)
            if now:
                trace.append(max(statistics.mean(now), trace[-1] if trace else 0))
            time.sleep(0.2)
        if c.wait(timeout=60) != 0:
            raise SystemExit(f"the job failed:\n{c.logs()}")
        s = c.summary()
        events = [e for e in c.events() if e["event"] == "tables"]
    t = s["tables"]
    most = {n: max([e["shards"].get(n, {}).get("rows", 0) for e in events] + [f["rows"]])
            for n, f in t["shards"].items()}
    held = [statistics.mean(f.get("rows", 0) for f in e["shards"].values()) for e in events
            if e["shards"]]
    return {"auc": s["auc"], "samples_per_s": s["samples_per_s"],
            "keys": {n: f["rows"] for n, f in t["shards"].items()},
            "keys_most": most,
            "peak_rss_mb": {n: round(v / 2**20) for n, v in sorted(peak.items())},
            # as the rows stream: the most so far at a quarter, half, three quarters and the
            # end of the run
            "rss_mb_quarters": [round(v / 2**20) for v in quarters(trace)],
            "keys_quarters": [round(v) for v in quarters(held)],
            "admitted": t["total"]["admitted"], "rejected": t["total"]["rejected"],
            "expired": t["total"]["expired"], "evicted": t["total"]["evicted"]}


def quarters(values: list[float]) -> list[float]:
    """The values a quarter, half, three quarters of the way and at the end."""
    if not values:
        return []
    return [values[min(len(values) - 1, len(values) * q // 4)] for q in (1, 2, 3)] + [
        values[-1]]


def compare(name: str, job_text: str, work: Path, repeat: int, expire: int) -> dict:
    runs: dict[str, list[dict]] = {"none": [], "bounded": []}
    for r in range(repeat):
        runs["none"].append(job_run(job_text, work / f"{name}-none-{r}"))
        runs["bounded"].append(job_run(job_text, work / f"{name}-bounded-{r}",
                                       embeddings__min_count=3,
                                       embeddings__expire_batches=expire))
        print(json.dumps({"run": name, "repeat": r, "none": runs["none"][-1],
                          "bounded": runs["bounded"][-1]}), flush=True)

    def med(kind: str, get) -> float:
        return statistics.median(get(x) for x in runs[kind])

    def keys(x: dict) -> float:
        return statistics.mean(x["keys_most"].values())

    def rss(x: dict) -> float:
        return statistics.mean(x["peak_rss_mb"].values())

    out = {"data": name, "repeat": repeat, "expire_batches": expire}
    for kind in runs:
        out[kind] = {"auc": round(med(kind, lambda x: x["auc"]), 4),
                     "keys_most_per_shard": round(med(kind, keys)),
                     "keys_end_per_shard": round(med(kind, lambda x: statistics.mean(
                         x["keys"].values()))),
                     "peak_rss_mb_per_shard": round(med(kind, rss)),
                     "rss_mb_quarters": runs[kind][0]["rss_mb_quarters"],
                     "keys_quarters": runs[kind][0]["keys_quarters"],
                     "samples_per_s": round(med(kind, lambda x: x["samples_per_s"]))}
    out["auc_cost"] = round(out["none"]["auc"] - out["bounded"]["auc"], 4)
    out["keys_ratio"] = round(out["bounded"]["keys_most_per_shard"]
                              / out["none"]["keys_most_per_shard"], 3)
    out["rss_ratio"] = round(out["bounded"]["peak_rss_mb_per_shard"]
                             / out["none"]["peak_rss_mb_per_shard"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--criteo-rows", type=int, nargs="*", default=[1_000_000, 3_000_000])
    parser.add_argument("--zipf-rows", type=int, nargs="*", default=[2_000_000])
    parser.add_argument("--expire", type=int, default=300,
                        help="expire_batches of the bounded runs")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--sweep-keys", type=int, default=10_000_000)
    parser.add_argument("--dir", help="where the generated files are kept (default: a "
                                      "temporary directory)")
    parser.add_argument("--parts-only", action="store_true")
    parser.add_argument("--jobs-only", action="store_true")
    args = parser.parse_args()
    if not args.jobs_only:
        print(json.dumps({"index": index_costs()}), flush=True)
        print(json.dumps({"sketch": sketch_costs()}), flush=True)
        print(json.dumps({"sweep": sweep_costs(args.sweep_keys)}), flush=True)
    if args.parts_only:
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.dir) if args.dir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for rows in args.zipf_rows:
            data = ZIPF_DATA.format(rows=rows, vocab=ZIPF_VOCAB)
            print(json.dumps({"jobs": compare(f"zipf-{rows}", admission_job(data), work,
                                              args.repeat, args.expire)}), flush=True)
        for rows in args.criteo_rows:
            data = criteo_data(make_criteo(rows, work))
            print(json.dumps({"jobs": compare(f"criteo-{rows}", admission_job(data), work,
                                              args.repeat, args.expire)}), flush=True)


if __name__ == "__main__":
    main()
